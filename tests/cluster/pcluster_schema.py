"""Writes tests/cluster/pcluster_schema.json from ParallelCluster's own source.

    pcluster_schema.py SOURCE VERSION_NOTE COMMIT > tests/cluster/pcluster_schema.json

SOURCE is a checkout (or export) of github.com/aws/aws-parallelcluster at the pinned release;
COMMIT and VERSION_NOTE are recorded in the file's "_source". The cluster config schema is
marshmallow Python (cli/src/pcluster/schemas/cluster_schema.py and common_schema.py), read here
with the ast module, never imported (importing needs ParallelCluster's dependencies). For every
schema class reachable from ClusterSchema: its keys, each the PascalCase of the field's name as
BaseSchema.on_bind_field binds it (common_schema.py), or its data_key; and the schema class a
key nests (fields.Nested, also inside fields.List; null: a scalar or a list of scalars). The
custom field OneOrManyCustomActionField (CustomActions.*) nests CustomActionSchema. Fields of
base classes are inherited. The enums the checker tests are the OneOf validators of the fields
named in ENUMS, with names resolved from cli/src/pcluster/constants.py and Enum classes.
"""

import ast
import json
import sys
from pathlib import Path

SCHEMA_FILES = ("cli/src/pcluster/schemas/cluster_schema.py", "cli/src/pcluster/schemas/common_schema.py")
# The enum keys of pcluster_schema.json (as tests/cluster/check_cluster_yaml.py matches them)
# and the schema class and field each comes from.
ENUMS = {
    "Image.Os": ("ImageSchema", "os"),
    "SlurmQueues[].CapacityType": ("SlurmQueueSchema", "capacity_type"),
    "Scheduling.Scheduler": ("SchedulingSchema", "scheduler"),
    "SlurmSettings.QueueUpdateStrategy": ("SlurmSettingsSchema", "queue_update_strategy"),
    "FsxLustreSettings.DeploymentType": ("FsxLustreSettingsSchema", "deployment_type"),
    "FsxLustreSettings.DeletionPolicy": ("FsxLustreSettingsSchema", "deletion_policy"),
    "DataRepositoryAssociations[].AutoImportPolicy[]": ("DataRepositoryAssociationSchema", "auto_import_policy"),
    "DataRepositoryAssociations[].AutoExportPolicy[]": ("DataRepositoryAssociationSchema", "auto_export_policy"),
    "SharedStorage[].StorageType": ("SharedStorageSchema", "storage_type"),
}
CUSTOM_NESTED = {"OneOrManyCustomActionField": "CustomActionSchema"}


def pascal(name):
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def call_name(node):
    """'fields.Nested' -> 'Nested', 'OneOrManyCustomActionField' -> itself."""
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def nested_of(node):
    """The schema class a field nests, or None."""
    if not isinstance(node, ast.Call):
        return None
    name = call_name(node)
    if name in CUSTOM_NESTED:
        return CUSTOM_NESTED[name]
    if name == "Nested" and node.args:
        target = node.args[0]
        if isinstance(target, ast.Lambda):
            target = target.body
        return getattr(target, "id", None) or getattr(target, "attr", None)
    if name == "List" and node.args:
        return nested_of(node.args[0])
    return None


def one_of(node):
    """The OneOf(...) argument of a field (or of the field inside a List), or None."""
    if not isinstance(node, ast.Call):
        return None
    for kw in node.keywords:
        if kw.arg == "validate" and isinstance(kw.value, ast.Call) and call_name(kw.value) == "OneOf":
            return kw.value.args[0]
    if call_name(node) == "List" and node.args:
        return one_of(node.args[0])
    return None


def custom_action_keys(field_class):
    """OneOrManyCustomActionField builds its schema class at run time, type(name, (base,), {...}):
    the keys of that dict, and the keys its _deserialize looks for ("Script" in value, "Sequence"
    in value). Sequence holds a list of the same actions; recorded as a scalar, as before."""
    keys = {}
    for node in ast.walk(field_class):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "type" and len(node.args) == 3 \
                and isinstance(node.args[2], ast.Dict):
            keys.update({pascal(k.value): None for k in node.args[2].keys})
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                isinstance(node.ops[0], ast.In) and isinstance(node.left.value, str):
            keys.setdefault(node.left.value, None)
    return dict(sorted(keys.items()))


def load_names(source):
    """Top-level constants of pcluster/constants.py and the values of every Enum class."""
    names, enums = {}, {}
    for path in (source / "cli/src/pcluster").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")).endswith("Enum")
                                                      for b in node.bases):
                values = [s.value.value for s in node.body if isinstance(s, ast.Assign)
                          and isinstance(s.value, ast.Constant)]
                enums.setdefault(node.name, values)
            elif path.name == "constants.py" and isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names[target.id] = node.value
    return names, enums


def evaluate(node, names, enums):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return evaluate(names[node.id], names, enums)
    if isinstance(node, (ast.List, ast.Tuple)):
        out = []
        for item in node.elts:
            value = evaluate(item, names, enums)
            out.extend(value if isinstance(value, list) else [value])
        return out
    if isinstance(node, ast.ListComp):  # [x.value for x in SomeEnum]
        return list(enums[node.generators[0].iter.id])
    raise ValueError(f"cannot evaluate {ast.dump(node)[:80]}")


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    source, version, commit = Path(argv[1]), argv[2], argv[3]
    classes = {}
    for rel in SCHEMA_FILES:
        for node in ast.parse((source / rel).read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node

    def fields_of(name, seen=()):
        node = classes[name]
        out = {}
        for base in node.bases:
            base_name = getattr(base, "id", None)
            if base_name in classes and base_name not in seen:
                out.update(fields_of(base_name, seen + (name,)))
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                    len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                attr = stmt.targets[0].id
                key = next((kw.value.value for kw in stmt.value.keywords if kw.arg == "data_key"),
                           pascal(attr))
                out[attr] = (key, nested_of(stmt.value), stmt.value)
        return out

    schemas, todo = {"CustomActionSchema": custom_action_keys(classes["OneOrManyCustomActionField"])}, \
        ["ClusterSchema"]
    while todo:
        name = todo.pop()
        if name in schemas or name not in classes:
            continue
        found = fields_of(name)
        schemas[name] = {key: nested for key, nested, _ in found.values()}
        todo.extend(n for _, n, _ in found.values() if n)
    names, enums_by_class = load_names(source)
    enums = {}
    for key, (cls, attr) in ENUMS.items():
        node = one_of(fields_of(cls)[attr][2])
        enums[key] = evaluate(node, names, enums_by_class)
    head = {"repository": "github.com/aws/aws-parallelcluster", "commit": commit, "version": version,
            "files": list(SCHEMA_FILES),
            "how": "tests/cluster/pcluster_schema.py: every schema class reachable from ClusterSchema, "
                   "its keys (marshmallow field names in PascalCase, as BaseSchema.on_bind_field binds "
                   "them, or their data_key) and the schema class a key nests (null: a scalar or list "
                   "of scalars); OneOrManyCustomActionField nests CustomActionSchema."}
    lines = ["{", f' "_source": {json.dumps(head)},', f' "enums": {json.dumps(enums)},', ' "schemas": {']
    body = [f"  {json.dumps(n)}: {json.dumps(dict(sorted(schemas[n].items())))}" for n in sorted(schemas)]
    lines.append(",\n".join(body))
    lines += [" }", "}"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
