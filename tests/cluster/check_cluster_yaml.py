"""Checks the rendered ParallelCluster config and its companions (tests/cluster/cluster_yaml.sh).

    check_cluster_yaml.py SOURCE_DIR RENDERED_YAML CAPACITY INSTANCE NAME=VALUE... plan.KEY=VALUE...

CAPACITY is the render.sh --capacity variant (ondemand, odcr, block), INSTANCE its --instance
(p4d.24xlarge, p5.48xlarge); NAME=VALUE are the placeholder values the YAML was rendered with;
plan.KEY=VALUE the `jumbo plan --storage` lines it was sized from. The keys and enums are checked against
ParallelCluster's own schema, read from its source (tests/cluster/pcluster_schema.json says
which commit and files). Prints one line per failed
check, naming the key and what was expected, then a summary; exits 1 if any check failed.
Needs PyYAML (Debian: python3-yaml).
"""

import json
import re
import sys
import tomllib
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
COMPUTED_PLACEHOLDERS = {"FSX_STORAGE_GIB", "FSX_THROUGHPUT_PER_TIB"}  # render.sh, from the plan
# Per instance type: the head node's type (its CPU runs the compute queue's -march code), the
# -march and the CUDA architecture of the jumbo build (on-node-configured.sh --arch, --cuda-arch).
INSTANCES = {"p4d.24xlarge": ("c6i.2xlarge", "cascadelake", "80"),
             "p5.48xlarge": ("c6a.2xlarge", "znver3", "90")}


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
    every = BASE_PLACEHOLDERS | RESERVED_PLACEHOLDERS | COMPUTED_PLACEHOLDERS
    check(body == every, "cluster.yaml placeholders", f"{sorted(every)} over all variants",
          sorted(body))
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


def check_cluster(config, values, source, capacity, instance):
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

    head_type, arch, cuda_arch = INSTANCES[instance]
    check(get(config, "HeadNode.InstanceType") == head_type, "HeadNode.InstanceType",
          f"{head_type!r} with {instance} (its CPU runs -march={arch} code)",
          get(config, "HeadNode.InstanceType"))
    check(get(config, "HeadNode.Networking.SubnetId") == values.get("HEAD_SUBNET_ID"),
          "HeadNode.Networking.SubnetId", repr(values.get("HEAD_SUBNET_ID")),
          get(config, "HeadNode.Networking.SubnetId"))
    check(get(config, "HeadNode.Ssh.KeyName") == values.get("SSH_KEY_NAME"),
          "HeadNode.Ssh.KeyName", repr(values.get("SSH_KEY_NAME")),
          get(config, "HeadNode.Ssh.KeyName"))
    check_custom_action(get(config, "HeadNode.CustomActions.OnNodeConfigured"),
                        "HeadNode.CustomActions.OnNodeConfigured", bucket, "head", arch, cuda_arch)
    check_s3_access(get(config, "HeadNode.Iam.S3Access"), "HeadNode.Iam.S3Access", bucket)

    check(get(config, "Scheduling.Scheduler") == "slurm", "Scheduling.Scheduler", "'slurm'",
          get(config, "Scheduling.Scheduler"))
    queues = get(config, "Scheduling.SlurmQueues")
    if not check(isinstance(queues, list) and queues, "Scheduling.SlurmQueues",
                 "a list of queues", queues):
        return
    # The queue that holds the GPU compute resource is the one the rest must be right for.
    found = None
    others = [get(r, "InstanceType") for q in queues for r in (get(q, "ComputeResources") or [])
              if str(get(r, "InstanceType")).startswith("p") and get(r, "InstanceType") != instance]
    check(not others, "Scheduling.SlurmQueues[].ComputeResources[].InstanceType",
          f"no GPU instance type but {instance}", others)
    for qi, queue in enumerate(queues):
        for ci, resource in enumerate(get(queue, "ComputeResources") or []):
            if get(resource, "InstanceType") == instance:
                found = (qi, queue, ci, resource)
                break
        if found:
            break
    if not check(found is not None, "Scheduling.SlurmQueues[].ComputeResources[].InstanceType",
                 f"a compute resource of {instance}"):
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
    """The GPU queue's capacity rules per variant (ParallelCluster's validators:
    cli/src/pcluster/validators/cluster_validators.py ComputeResourceSizeValidator and
    ec2_validators.py CapacityTypeValidator, PlacementGroupCapacityTypeValidator)."""
    min_count, max_count = get(resource, "MinCount"), get(resource, "MaxCount")
    target = get(resource, "CapacityReservationTarget")
    pg = get(queue, "Networking.PlacementGroup.Enabled")
    ctype = get(queue, "CapacityType")
    if capacity == "ondemand":
        check(ctype == "ONDEMAND", f"{q}.CapacityType", "'ONDEMAND'", ctype)
        check(min_count == 0, f"{r}.MinCount", "0 (no idle GPU node billed between jobs)", min_count)
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


def check_custom_action(action, where, bucket, role, arch=None, cuda_arch=None):
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
        if arch:
            check(pairs.get("--arch") == arch, f"{where}.Args --arch", repr(arch), pairs.get("--arch"))
            check(pairs.get("--cuda-arch") == cuda_arch, f"{where}.Args --cuda-arch", repr(cuda_arch),
                  pairs.get("--cuda-arch"))


def check_s3_access(access, where, bucket):
    names = [get(a, "BucketName") for a in access] if isinstance(access, list) else access
    check(isinstance(names, list) and bucket in names, f"{where}[].BucketName",
          f"an entry for {bucket!r}", names)


def check_storage(config, values, plan, source, rendered_text):
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
    check(get(s, "DeletionPolicy") == "Retain", f"{w}.FsxLustreSettings.DeletionPolicy",
          "'Retain' (unexported files and /fsx/jumbo/runs would die with the cluster)",
          get(s, "DeletionPolicy"))
    check_sizing(s, w, plan, rendered_text)
    # PERSISTENT_2 links to S3 through a data repository association, never ImportPath.
    check(get(s, "ImportPath") is MISSING and get(s, "ExportPath") is MISSING,
          f"{w}.FsxLustreSettings.ImportPath/ExportPath",
          "absent (PERSISTENT_2 uses DataRepositoryAssociations)", get(s, "ImportPath"))
    associations = get(s, "DataRepositoryAssociations")
    if not check(isinstance(associations, list) and associations,
                 f"{w}.FsxLustreSettings.DataRepositoryAssociations", "a list", associations):
        return
    bucket = values.get("S3_BUCKET", "")
    paths = []
    for i, dra in enumerate(associations):
        d = f"{w}.FsxLustreSettings.DataRepositoryAssociations[{i}]"
        for key in ("Name", "DataRepositoryPath", "FileSystemPath"):
            check(isinstance(get(dra, key), str), f"{d}.{key}", "a string", get(dra, key))
        check(str(get(dra, "DataRepositoryPath")).startswith(f"s3://{bucket}/"),
              f"{d}.DataRepositoryPath", f"a path in s3://{bucket}/", get(dra, "DataRepositoryPath"))
        for key in ("AutoImportPolicy", "AutoExportPolicy"):
            events = get(dra, key)
            check(events is MISSING or (isinstance(events, list) and
                                        set(events) <= {"NEW", "CHANGED", "DELETED"}),
                  f"{d}.{key}", "a list of NEW, CHANGED, DELETED", events)
        # S3 is a backup: nothing deleted on the file system is deleted in S3.
        events = get(dra, "AutoExportPolicy")
        check(not isinstance(events, list) or "DELETED" not in events, f"{d}.AutoExportPolicy",
              "no DELETED (a deletion on FSx, e.g. checkpoint retention, must not delete the S3 copy)",
              events)
        paths.append(str(get(dra, "FileSystemPath")).rstrip("/"))
    for a in paths:
        for b in paths:
            check(a == b or not b.startswith(a + "/"),
                  f"{w}.FsxLustreSettings.DataRepositoryAssociations[].FileSystemPath",
                  f"paths that do not nest (FSx refuses overlapping associations): {a} holds {b}", paths)
    # The run's checkpoint directory lies under an association that exports new and changed files.
    run = tomllib.loads((source / "inputs/runs/j1-jumbo.toml").read_text())
    ckpt = run.get("checkpoint", {}).get("dir", "")
    mount = str(get(fsx, "MountDir")).rstrip("/")
    covering = [dra for dra in associations
                if ckpt.startswith(mount + str(get(dra, "FileSystemPath")).rstrip("/") + "/")]
    if check(len(covering) == 1, f"{w}.FsxLustreSettings.DataRepositoryAssociations",
             f"one association whose FileSystemPath holds checkpoint.dir {ckpt!r} of "
             "inputs/runs/j1-jumbo.toml", paths):
        name = get(covering[0], "Name")
        events = get(covering[0], "AutoExportPolicy")
        check(isinstance(events, list) and {"NEW", "CHANGED"} <= set(events),
              f"{w}.FsxLustreSettings.DataRepositoryAssociations[{name}].AutoExportPolicy",
              "NEW and CHANGED (every file of a save reaches S3)", events)
        check(get(covering[0], "BatchImportMetaDataOnCreate") is True,
              f"{w}.FsxLustreSettings.DataRepositoryAssociations[{name}].BatchImportMetaDataOnCreate",
              "true (a new cluster lists the checkpoints already in S3)",
              get(covering[0], "BatchImportMetaDataOnCreate"))


TIERS = (125, 250, 500, 1000)  # PERSISTENT_2 MB/s/TiB (FSx for Lustre User Guide)


def fsx_size(gib):
    """The smallest PERSISTENT_2 SSD size >= gib: 1200, 2400, then multiples of 2400."""
    return 1200 if gib <= 1200 else -(-gib // 2400) * 2400


def fs_rate(tier, gib):
    """Bytes/s of a file system of gib GiB at tier MB/s/TiB (MB = 10^6 bytes, TiB = 1024 GiB)."""
    return tier * 10**6 * gib // 1024


def check_sizing(s, w, plan, rendered_text):
    """StorageCapacity and PerUnitStorageThroughput against the plan, worked out here again."""
    capacity = get(s, "StorageCapacity")
    tier = get(s, "PerUnitStorageThroughput")
    check(isinstance(capacity, int) and capacity == fsx_size(capacity),
          f"{w}.FsxLustreSettings.StorageCapacity",
          "1200, 2400 or a multiple of 2400 GiB (PERSISTENT_2 sizes)", capacity)
    check(tier in TIERS, f"{w}.FsxLustreSettings.PerUnitStorageThroughput",
          "125, 250, 500 or 1000 (MB/s/TiB)", tier)
    if not (isinstance(capacity, int) and tier in TIERS and plan):
        return
    peak = plan["peak_bytes"]
    need = -(-(peak * 5 // 4) // 2**30)
    smallest = fsx_size(need)
    if fs_rate(1000, smallest) < plan["save_bytes_per_s"]:  # grown to be fast enough
        smallest = fsx_size(-(-plan["save_bytes_per_s"] * 1024 // (1000 * 10**6)))
    check(capacity == smallest, f"{w}.FsxLustreSettings.StorageCapacity",
          f"{smallest} GiB: peak {peak} bytes x 1.25 = {need} GiB, rounded up to a PERSISTENT_2 size",
          capacity)
    fast = [t for t in TIERS if fs_rate(t, capacity) >= plan["save_bytes_per_s"]]
    check(bool(fast) and tier == fast[0], f"{w}.FsxLustreSettings.PerUnitStorageThroughput",
          f"the smallest tier writing save_bytes_per_s={plan['save_bytes_per_s']} at {capacity} GiB "
          f"({fast[0] if fast else 'none'})", tier)
    for key in ("checkpoint_bytes", "checkpoints_at_peak", "peak_bytes", "save_bytes_per_s"):
        check(f"{key}={plan[key]}" in rendered_text, f"rendered cluster.yaml: {key}",
              "the plan's line in the sizing comments")
    check("x 1.25 margin" in rendered_text, "rendered cluster.yaml: sizing comments",
          "the margin stated (x 1.25 margin)")


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
    if len(argv) < 5 or argv[3] not in ("ondemand", "odcr", "block") or argv[4] not in INSTANCES:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    source, rendered = Path(argv[1]), Path(argv[2])
    capacity, instance = argv[3], argv[4]
    pairs = dict(arg.split("=", 1) for arg in argv[5:])
    values = {k: v for k, v in pairs.items() if not k.startswith("plan.")}
    plan = {k[len("plan."):]: int(v) for k, v in pairs.items() if k.startswith("plan.")}
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
    check_cluster(config, values, source, capacity, instance)
    check_cpu_queue(config)
    schema = json.loads((source / "tests/cluster/pcluster_schema.json").read_text())
    check_schema(config, "ClusterSchema", "", schema["schemas"], schema["enums"])
    check_storage(config, values, plan, source, rendered_text)
    check_monitoring(config)
    check_agent_config(source)
    for line in failures:
        print(line)
    print(f"check_cluster_yaml: {passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
