"""Checks the rendered ParallelCluster config and its companions (tests/cluster/cluster_yaml.sh).

    check_cluster_yaml.py SOURCE_DIR RENDERED_YAML CAPACITY NAME=VALUE...

CAPACITY is the render.sh --capacity variant (ondemand, odcr, block); NAME=VALUE are the
placeholder values the YAML was rendered with. The keys and enums are checked against
ParallelCluster's own schema, read from its source (tests/cluster/pcluster_schema.json says
which commit and files). Prints one line per failed
check, naming the key and what was expected, then a summary; exits 1 if any check failed.
Needs PyYAML (Debian: python3-yaml).
"""

import json
import re
import sys
from pathlib import Path

import yaml

MISSING = object()
failures = []
passed = 0


def check(ok, where, expected, got=MISSING):
    """Counts one check; on failure records 'where: expected ..., got ...'."""
    global passed
    if ok:
        passed += 1
        return True
    got_text = "missing" if got is MISSING else repr(got)
    failures.append(f"{where}: expected {expected}, got {got_text}")
    return False


def get(node, dotted):
    """node['A']['B'][...] for 'A.B...', or MISSING where a key or list index is absent."""
    for part in dotted.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return MISSING
    return node


def placeholders_in(text):
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))


BASE_PLACEHOLDERS = {"AWS_REGION", "HEAD_SUBNET_ID", "COMPUTE_SUBNET_ID", "SSH_KEY_NAME", "S3_BUCKET"}
RESERVED_PLACEHOLDERS = {"CAPACITY_RESERVATION_ID", "RESERVED_NODES"}


def check_placeholders(source, rendered_text, values, capacity):
    template_text = (source / "parallelcluster/cluster.yaml").read_text()
    # The documented list: the comment lines at the top of the file, before the first key.
    header = []
    for line in template_text.splitlines():
        if line and not line.startswith("#"):
            break
        header.append(line)
    documented = placeholders_in("\n".join(header))
    body = placeholders_in(template_text[len("\n".join(header)):])
    check(documented == body, "cluster.yaml placeholders",
          f"those used in the body {sorted(body)} listed in the comment block at the top",
          sorted(documented))
    check(body == BASE_PLACEHOLDERS | RESERVED_PLACEHOLDERS, "cluster.yaml placeholders",
          f"{sorted(BASE_PLACEHOLDERS | RESERVED_PLACEHOLDERS)} over all variants", sorted(body))
    wanted = BASE_PLACEHOLDERS | (RESERVED_PLACEHOLDERS if capacity != "ondemand" else set())
    check(set(values) == wanted, f"render.sh --capacity {capacity}: placeholders",
          f"the test to render with {sorted(wanted)}", sorted(values))
    try:
        readme = (source / "parallelcluster/README.md").read_text()
    except OSError as error:
        readme = ""
        check(False, "parallelcluster/README.md", "a readable file", str(error))
    for name in sorted(body):
        check("${" + name + "}" in readme, f"parallelcluster/README.md: ${{{name}}}",
              "the placeholder to be documented in the README")
    check("${" not in rendered_text, "rendered cluster.yaml",
          "no unsubstituted '${' left after render.sh",
          [line.strip() for line in rendered_text.splitlines() if "${" in line][:3])


def check_cluster(config, values, source, capacity):
    bucket = values.get("S3_BUCKET", "")
    check(get(config, "Region") == values.get("AWS_REGION"), "Region",
          repr(values.get("AWS_REGION")), get(config, "Region"))

    # Image.Os must be the OS the install script is written for (apt, package names).
    script = (source / "parallelcluster/on-node-configured.sh").read_text()
    match = re.search(r"^readonly SUPPORTED_OS=(\w+)", script, re.M)
    script_os = match.group(1) if match else None
    check(get(config, "Image.Os") in ("ubuntu2204", "alinux2023"), "Image.Os",
          "ubuntu2204 or alinux2023", get(config, "Image.Os"))
    check(get(config, "Image.Os") == script_os, "Image.Os",
          f"the OS on-node-configured.sh installs for (SUPPORTED_OS={script_os})",
          get(config, "Image.Os"))

    head_type = get(config, "HeadNode.InstanceType")
    check(isinstance(head_type, str) and head_type != "", "HeadNode.InstanceType",
          "an instance type", head_type)
    check(get(config, "HeadNode.Networking.SubnetId") == values.get("HEAD_SUBNET_ID"),
          "HeadNode.Networking.SubnetId", repr(values.get("HEAD_SUBNET_ID")),
          get(config, "HeadNode.Networking.SubnetId"))
    check(get(config, "HeadNode.Ssh.KeyName") == values.get("SSH_KEY_NAME"),
          "HeadNode.Ssh.KeyName", repr(values.get("SSH_KEY_NAME")),
          get(config, "HeadNode.Ssh.KeyName"))
    check_custom_action(get(config, "HeadNode.CustomActions.OnNodeConfigured"),
                        "HeadNode.CustomActions.OnNodeConfigured", bucket, "head")
    check_s3_access(get(config, "HeadNode.Iam.S3Access"), "HeadNode.Iam.S3Access", bucket)

    check(get(config, "Scheduling.Scheduler") == "slurm", "Scheduling.Scheduler", "'slurm'",
          get(config, "Scheduling.Scheduler"))
    queues = get(config, "Scheduling.SlurmQueues")
    if not check(isinstance(queues, list) and queues, "Scheduling.SlurmQueues",
                 "a list of queues", queues):
        return
    # The queue that holds the p4d compute resource is the one the rest must be right for.
    found = None
    for qi, queue in enumerate(queues):
        for ci, resource in enumerate(get(queue, "ComputeResources") or []):
            if get(resource, "InstanceType") == "p4d.24xlarge":
                found = (qi, queue, ci, resource)
                break
        if found:
            break
    if not check(found is not None, "Scheduling.SlurmQueues[].ComputeResources[].InstanceType",
                 "a compute resource of p4d.24xlarge"):
        return
    qi, queue, ci, resource = found
    q = f"Scheduling.SlurmQueues[{qi}]"
    r = f"{q}.ComputeResources[{ci}]"
    check(isinstance(get(resource, "Name"), str), f"{r}.Name", "a name", get(resource, "Name"))
    check(get(resource, "Efa.Enabled") is True, f"{r}.Efa.Enabled", "true",
          get(resource, "Efa.Enabled"))
    check_capacity(queue, q, resource, r, values, capacity)
    check(get(queue, "Networking.SubnetIds") == [values.get("COMPUTE_SUBNET_ID")],
          f"{q}.Networking.SubnetIds", repr([values.get("COMPUTE_SUBNET_ID")]),
          get(queue, "Networking.SubnetIds"))
    check_custom_action(get(queue, "CustomActions.OnNodeConfigured"),
                        f"{q}.CustomActions.OnNodeConfigured", bucket, "compute")
    check_s3_access(get(queue, "Iam.S3Access"), f"{q}.Iam.S3Access", bucket)


def check_capacity(queue, q, resource, r, values, capacity):
    """The p4d queue's capacity rules per variant (ParallelCluster's validators:
    cli/src/pcluster/validators/cluster_validators.py ComputeResourceSizeValidator and
    ec2_validators.py CapacityTypeValidator, PlacementGroupCapacityTypeValidator)."""
    min_count, max_count = get(resource, "MinCount"), get(resource, "MaxCount")
    target = get(resource, "CapacityReservationTarget")
    pg = get(queue, "Networking.PlacementGroup.Enabled")
    ctype = get(queue, "CapacityType")
    if capacity == "ondemand":
        check(ctype == "ONDEMAND", f"{q}.CapacityType", "'ONDEMAND'", ctype)
        check(min_count == 0, f"{r}.MinCount", "0 (no idle p4d billed between jobs)", min_count)
        check(isinstance(max_count, int) and max_count >= 1, f"{r}.MaxCount", "an integer >= 1",
              max_count)
        check(pg is True, f"{q}.Networking.PlacementGroup.Enabled", "true", pg)
        check(target is MISSING and get(queue, "CapacityReservationTarget") is MISSING,
              f"{r}.CapacityReservationTarget", "absent without a reservation", target)
        return
    want_type = "CAPACITY_BLOCK" if capacity == "block" else "ONDEMAND"
    check(ctype == want_type, f"{q}.CapacityType", repr(want_type), ctype)
    nodes = int(values.get("RESERVED_NODES", "0"))
    check(min_count == nodes and max_count == nodes and nodes > 0, f"{r}.MinCount/MaxCount",
          f"both {nodes} (MinCount = MaxCount > 0, static nodes of the reservation)",
          [min_count, max_count])
    check(get(resource, "CapacityReservationTarget.CapacityReservationId") ==
          values.get("CAPACITY_RESERVATION_ID"), f"{r}.CapacityReservationTarget.CapacityReservationId",
          repr(values.get("CAPACITY_RESERVATION_ID")), target)
    check(pg is False, f"{q}.Networking.PlacementGroup.Enabled",
          "false (a placement constraint outside the reservation fails launches)", pg)
    check(get(resource, "Instances") is MISSING and get(queue, "AllocationStrategy") is MISSING,
          f"{r}", "one InstanceType and no AllocationStrategy with a reservation",
          get(queue, "AllocationStrategy"))


def check_cpu_queue(config):
    """A small, not exclusive CPU queue named cpu: slurm/sweep.sh sends its summary job there."""
    queues = get(config, "Scheduling.SlurmQueues")
    cpu = [qu for qu in queues if get(qu, "Name") == "cpu"] if isinstance(queues, list) else []
    if not check(len(cpu) == 1, "Scheduling.SlurmQueues[Name=cpu]", "one queue named cpu"):
        return
    qu = cpu[0]
    check(get(qu, "JobExclusiveAllocation") in (MISSING, False),
          "Scheduling.SlurmQueues[cpu].JobExclusiveAllocation", "absent or false", get(qu, "JobExclusiveAllocation"))
    for i, res in enumerate(get(qu, "ComputeResources") or []):
        itype = str(get(res, "InstanceType"))
        check(re.match(r"^(c5|c6i|c6a|c7i|m5|m6i|m7i)\.", itype) is not None,
              f"Scheduling.SlurmQueues[cpu].ComputeResources[{i}].InstanceType",
              "a CPU instance type (c5/c6i/c7i/m5/m6i...)", itype)
        check(get(res, "MinCount") == 0, f"Scheduling.SlurmQueues[cpu].ComputeResources[{i}].MinCount",
              "0", get(res, "MinCount"))
    check(get(queues[0], "Name") != "cpu", "Scheduling.SlurmQueues[0].Name",
          "the GPU queue first (Slurm's default partition)", get(queues[0], "Name"))


def check_schema(node, schema_name, where, schemas, enums):
    """Every key is one ParallelCluster's schema class knows, recursively; enums by value."""
    known = schemas.get(schema_name)
    if known is None or not isinstance(node, dict):
        return
    for key, value in node.items():
        path = f"{where}.{key}" if where else key
        if not check(key in known, path,
                     f"a key of ParallelCluster's {schema_name} (one of {sorted(known)})", key):
            continue
        for enum_key, allowed in enums.items():
            parts = enum_key.split(".")
            tail = parts[-1].rstrip("[]")
            parent = parts[0].split("[")[0] if len(parts) > 1 else None
            if tail == key and (parent is None or parent in where.split(".")[-1].split("[")[0]
                                or where.endswith(parent) or parent in where):
                items = value if isinstance(value, list) and enum_key.endswith("[]") else [value]
                for item in items:
                    check(item in allowed, path, f"one of {allowed}", item)
        nested = known[key]
        if nested:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                check_schema(item, nested, f"{path}[{i}]" if isinstance(value, list) else path,
                             schemas, enums)


def check_custom_action(action, where, bucket, role):
    script = get(action, "Script") if action is not MISSING else MISSING
    check(script == f"s3://{bucket}/jumbo/on-node-configured.sh", f"{where}.Script",
          f"'s3://{bucket}/jumbo/on-node-configured.sh'", script)
    args = get(action, "Args") if action is not MISSING else MISSING
    ok = isinstance(args, list) and all(isinstance(a, str) for a in args)
    if check(ok, f"{where}.Args", "a list of strings", args):
        pairs = dict(zip(args[::2], args[1::2]))
        check(pairs.get("--role") == role, f"{where}.Args --role", repr(role), pairs.get("--role"))
        check(pairs.get("--artifacts") == f"s3://{bucket}/jumbo", f"{where}.Args --artifacts",
              f"'s3://{bucket}/jumbo'", pairs.get("--artifacts"))


def check_s3_access(access, where, bucket):
    names = [get(a, "BucketName") for a in access] if isinstance(access, list) else access
    check(isinstance(names, list) and bucket in names, f"{where}[].BucketName",
          f"an entry for {bucket!r}", names)


def check_storage(config, values):
    storage = get(config, "SharedStorage")
    entries = [s for s in storage if get(s, "StorageType") == "FsxLustre"] \
        if isinstance(storage, list) else []
    if not check(len(entries) == 1, "SharedStorage[].StorageType",
                 "exactly one FsxLustre entry", storage):
        return
    fsx = entries[0]
    w = "SharedStorage[FsxLustre]"
    check(get(fsx, "MountDir") == "/fsx", f"{w}.MountDir", "'/fsx'", get(fsx, "MountDir"))
    check(isinstance(get(fsx, "Name"), str), f"{w}.Name", "a name", get(fsx, "Name"))
    s = get(fsx, "FsxLustreSettings")
    check(get(s, "DeploymentType") == "PERSISTENT_2", f"{w}.FsxLustreSettings.DeploymentType",
          "'PERSISTENT_2'", get(s, "DeploymentType"))
    check(get(s, "PerUnitStorageThroughput") in (125, 250, 500, 1000),
          f"{w}.FsxLustreSettings.PerUnitStorageThroughput", "125, 250, 500 or 1000 (MB/s/TiB)",
          get(s, "PerUnitStorageThroughput"))
    capacity = get(s, "StorageCapacity")
    check(isinstance(capacity, int) and (capacity in (1200, 2400) or
                                         (capacity > 0 and capacity % 2400 == 0)),
          f"{w}.FsxLustreSettings.StorageCapacity",
          "1200, 2400 or a multiple of 2400 GiB (PERSISTENT_2 sizes)", capacity)
    # PERSISTENT_2 links to S3 through a data repository association, never ImportPath.
    check(get(s, "ImportPath") is MISSING and get(s, "ExportPath") is MISSING,
          f"{w}.FsxLustreSettings.ImportPath/ExportPath",
          "absent (PERSISTENT_2 uses DataRepositoryAssociations)", get(s, "ImportPath"))
    associations = get(s, "DataRepositoryAssociations")
    if check(isinstance(associations, list) and associations,
             f"{w}.FsxLustreSettings.DataRepositoryAssociations", "a list", associations):
        bucket = values.get("S3_BUCKET", "")
        for i, dra in enumerate(associations):
            d = f"{w}.FsxLustreSettings.DataRepositoryAssociations[{i}]"
            for key in ("Name", "DataRepositoryPath", "FileSystemPath"):
                check(isinstance(get(dra, key), str), f"{d}.{key}", "a string", get(dra, key))
            check(str(get(dra, "DataRepositoryPath")).startswith(f"s3://{bucket}/"),
                  f"{d}.DataRepositoryPath", f"a path in s3://{bucket}/",
                  get(dra, "DataRepositoryPath"))
            for key in ("AutoImportPolicy", "AutoExportPolicy"):
                events = get(dra, key)
                check(events is MISSING or (isinstance(events, list) and
                                            set(events) <= {"NEW", "CHANGED", "DELETED"}),
                      f"{d}.{key}", "a list of NEW, CHANGED, DELETED", events)


def check_monitoring(config):
    for key in ("Monitoring.Logs.CloudWatch.Enabled", "Monitoring.Dashboards.CloudWatch.Enabled"):
        check(get(config, key) is True, key, "true", get(config, key))


def check_agent_config(source):
    path = source / "parallelcluster/cloudwatch-agent.json"
    try:
        agent = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        check(False, "parallelcluster/cloudwatch-agent.json", "valid JSON", str(error))
        return
    w = "cloudwatch-agent.json"
    check(isinstance(get(agent, "logs.metrics_collected.emf"), dict),
          f"{w}: logs.metrics_collected.emf", "an object (the agent's EMF endpoint, tcp/udp 25888)",
          get(agent, "logs.metrics_collected.emf"))
    entries = get(agent, "logs.logs_collected.files.collect_list")
    emf_entries = [e for e in entries if "emf" in str(get(e, "file_path"))] \
        if isinstance(entries, list) else []
    if check(emf_entries, f"{w}: logs.logs_collected.files.collect_list[].file_path",
             "an entry collecting the EMF file(s) jumbo writes", entries):
        entry = emf_entries[0]
        check(str(get(entry, "file_path")).startswith("/fsx/"), f"{w}: collect_list[emf].file_path",
              "a path on /fsx (log.emf_file of the runs)", get(entry, "file_path"))
        check(isinstance(get(entry, "log_group_name"), str) and get(entry, "log_group_name"),
              f"{w}: collect_list[emf].log_group_name", "a log group", get(entry, "log_group_name"))
        # A glob picks only the newest matching file unless publish_multi_logs is true.
        if "*" in str(get(entry, "file_path")):
            check(get(entry, "publish_multi_logs") is True,
                  f"{w}: collect_list[emf].publish_multi_logs",
                  "true (else the agent tails only the newest file the glob matches)",
                  get(entry, "publish_multi_logs"))


def main(argv):
    if len(argv) < 4 or argv[3] not in ("ondemand", "odcr", "block"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    source, rendered = Path(argv[1]), Path(argv[2])
    capacity = argv[3]
    values = dict(arg.split("=", 1) for arg in argv[4:])
    rendered_text = rendered.read_text()
    try:
        config = yaml.safe_load(rendered_text)
    except yaml.YAMLError as error:
        print(f"rendered cluster.yaml: expected valid YAML, got: {error}".replace("\n", " "))
        return 1
    if not isinstance(config, dict):
        print(f"rendered cluster.yaml: expected a mapping at the top, got {type(config).__name__}")
        return 1
    check_placeholders(source, rendered_text, values, capacity)
    check_cluster(config, values, source, capacity)
    check_cpu_queue(config)
    schema = json.loads((source / "tests/cluster/pcluster_schema.json").read_text())
    check_schema(config, "ClusterSchema", "", schema["schemas"], schema["enums"])
    check_storage(config, values)
    check_monitoring(config)
    check_agent_config(source)
    for line in failures:
        print(line)
    print(f"check_cluster_yaml: {passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
