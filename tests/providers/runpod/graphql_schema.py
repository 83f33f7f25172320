"""The part of RunPod's GraphQL schema that Tensorant, the runpod package and the agent's self-stop
use, and a validator that refuses a request the way RunPod's server (graphql-js) does.

RunPod publishes its schema at graphql-spec.runpod.io; these types hold the fields the public clients
are seen sending and reading: runpod-python (runpod/api/queries, runpod/api/mutations/pods.py),
dstack's RunPod backend (`minCudaVersion` on podFindAndDeployOnDemand) and gpuhunt's catalog
(`$lowestPriceInput: GpuLowestPriceInput` with `minCudaVersion`). A field, argument or input field
that is not here is refused with graphql-js's words, answered HTTP 400 as RunPod answers a request
its schema refuses:
- `Cannot query field "x" on type "T".` (a selection),
- `Unknown argument "x" on field "T.f".` (an argument),
- `Field "x" is not defined by type "T".` (an input object's field, written in the query), or
  `Variable "$v" got invalid value {...}; Field "x" is not defined by type "T".` (sent as a variable),
- `Variable "$v" is never used in operation "Op".` / `Variable "$v" is not defined by operation "Op".`
A request the fake does not know at all is refused too, so a test fails on it instead of passing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Output types: type -> field -> (its type, its arguments -> their input types). A type ending in
# "!" is non-null, "[...]" a list; SCALARS have no selection.
SCALARS = {"String", "Int", "Float", "Boolean", "ID", "JSON", "Void"}
ENUMS = {"CloudTypeEnum": {"ALL", "SECURE", "COMMUNITY"}}
_POD: dict[str, tuple[str, dict[str, str]]] = {name: ("String", {}) for name in (
    "id", "name", "desiredStatus", "lastStatusChange", "imageName", "machineId", "dockerArgs", "dockerId",
    "podType", "ports", "volumeMountPath")}
_POD.update({name: ("Int", {}) for name in (
    "gpuCount", "volumeInGb", "containerDiskInGb", "memoryInGb", "vcpuCount", "port", "uptimeSeconds")})
_POD.update({"costPerHr": ("Float", {}), "env": ("[String]", {}), "runtime": ("PodRuntime", {}),
             "machine": ("PodMachineInfo", {})})
OUTPUT: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "Query": {
        "myself": ("User", {}),
        "pod": ("Pod", {"input": "PodFilter"}),
        "gpuTypes": ("[GpuType]", {"input": "GpuTypeFilter"}),
    },
    "Mutation": {
        "podFindAndDeployOnDemand": ("Pod", {"input": "PodFindAndDeployOnDemandInput"}),
        "podStop": ("Pod", {"input": "PodStopInput!"}),
        "podResume": ("Pod", {"input": "PodResumeInput!"}),
        "podTerminate": ("Void", {"input": "PodTerminateInput!"}),
    },
    "User": {"id": ("String", {}), "authId": ("String", {}), "email": ("String", {}),
             "clientBalance": ("Float", {}), "pods": ("[Pod]", {}), "networkVolumes": ("[NetworkVolume]", {})},
    "Pod": _POD,
    "PodRuntime": {"uptimeInSeconds": ("Int", {}), "ports": ("[PodRuntimePorts]", {})},
    "PodRuntimePorts": {n: ("String", {}) for n in ("ip", "isIpPublic", "privatePort", "publicPort", "type")},
    "PodMachineInfo": {"podHostId": ("String", {}), "gpuDisplayName": ("String", {})},
    "NetworkVolume": {"id": ("String", {}), "name": ("String", {}), "size": ("Int", {}),
                      "dataCenterId": ("String", {})},
    "GpuType": {
        **{n: ("String", {}) for n in ("id", "displayName", "manufacturer")},
        **{n: ("Int", {}) for n in ("memoryInGb", "cudaCores", "maxGpuCount", "maxGpuCountCommunityCloud",
                                    "maxGpuCountSecureCloud", "minPodGpuCount")},
        **{n: ("Boolean", {}) for n in ("secureCloud", "communityCloud")},
        **{n: ("Float", {}) for n in ("securePrice", "communityPrice", "oneMonthPrice", "threeMonthPrice",
                                      "sixMonthPrice", "oneWeekPrice", "communitySpotPrice", "secureSpotPrice")},
        "lowestPrice": ("LowestPrice", {"input": "GpuLowestPriceInput"}),
    },
    "LowestPrice": {
        **{n: ("String", {}) for n in ("gpuName", "gpuTypeId", "stockStatus", "countryCode", "compliance")},
        **{n: ("Float", {}) for n in ("minimumBidPrice", "uninterruptablePrice")},
        **{n: ("Int", {}) for n in ("minMemory", "minVcpu", "maxUnreservedGpuCount", "rentedCount", "totalCount")},
        "availableGpuCounts": ("[Int]", {}),
    },
}
# Input types: type -> field -> its type.
INPUT: dict[str, dict[str, str]] = {
    "PodFilter": {"podId": "String!"},
    "PodStopInput": {"podId": "String!", "incrementVersion": "Boolean"},
    "PodResumeInput": {"podId": "String!", "gpuCount": "Int"},
    "PodTerminateInput": {"podId": "String!"},
    "GpuTypeFilter": {"id": "String", "ids": "[String]", "cluster": "Boolean"},
    # No allowedCudaVersions: a price is asked for hosts at or above a CUDA version (gpuhunt sends it so).
    "GpuLowestPriceInput": {
        "gpuCount": "Int", "minDisk": "Int", "minMemoryInGb": "Int", "minVcpuCount": "Int", "secureCloud": "Boolean",
        "compliance": "[String]", "dataCenterId": "String", "globalNetwork": "Boolean", "countryCode": "String",
        "minDownload": "Int", "minUpload": "Int", "supportPublicIp": "Boolean", "minCudaVersion": "String"},
    "PodFindAndDeployOnDemandInput": {
        **{n: "String" for n in ("name", "imageName", "gpuTypeId", "dataCenterId", "countryCode", "dockerArgs",
                                 "ports", "volumeMountPath", "templateId", "networkVolumeId", "minCudaVersion",
                                 "containerRegistryAuthId")},
        **{n: "Int" for n in ("gpuCount", "volumeInGb", "containerDiskInGb", "minVcpuCount", "minMemoryInGb",
                              "minDownload", "minUpload", "minDisk")},
        **{n: "Boolean" for n in ("startSsh", "startJupyter", "supportPublicIp")},
        "cloudType": "CloudTypeEnum", "env": "[EnvironmentVariableInput]", "allowedCudaVersions": "[String]"},
    "EnvironmentVariableInput": {"key": "String", "value": "String"},
}


class GraphQLSyntaxError(ValueError):
    pass


@dataclass
class Field:
    name: str
    args: dict[str, Any]  # argument -> value node (see _value)
    selections: list[Field] = field(default_factory=list)
    has_selection: bool = False


@dataclass
class Operation:
    kind: str  # "query" or "mutation"
    name: str
    variables: dict[str, str]  # $name (without $) -> declared type
    selections: list[Field]

    def find(self, *path: str) -> Field | None:
        """The field at this path of names from the root (the first of each name)."""
        fields, found = self.selections, None
        for name in path:
            found = next((f for f in fields if f.name == name), None)
            if found is None:
                return None
            fields = found.selections
        return found


# ---------------------------------------------------------------- parsing

_TOKEN = re.compile(r'\s+|,|#[^\n]*|(?P<tok>\.\.\.|[{}()\[\]:!$=@]|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?'
                    r'|"(?:\\.|[^"\\\n])*"|[_A-Za-z][_0-9A-Za-z]*)')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise GraphQLSyntaxError(f"Syntax Error: Unexpected character: {text[pos]!r}.")
        if m.group("tok"):
            out.append(m.group("tok"))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else "<EOF>"

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok == "<EOF>" or (want is not None and tok != want):
            raise GraphQLSyntaxError(f"Syntax Error: Expected {want or 'a token'}, found {tok}.")
        self.i += 1
        return tok

    def name(self) -> str:
        tok = self.take()
        if not re.fullmatch(r"[_A-Za-z][_0-9A-Za-z]*", tok):
            raise GraphQLSyntaxError(f"Syntax Error: Expected Name, found {tok}.")
        return tok

    def document(self) -> Operation:
        kind, name, variables = "query", "", {}
        if self.peek() in ("query", "mutation"):
            kind = self.take()
            if self.peek() not in ("(", "{"):
                name = self.name()
            if self.peek() == "(":
                self.take("(")
                while self.peek() != ")":
                    self.take("$")
                    var = self.name()
                    self.take(":")
                    variables[var] = self.type()
                    if self.peek() == "=":
                        self.take("=")
                        self.value()
                self.take(")")
        op = Operation(kind, name, variables, self.selection_set())
        if self.peek() != "<EOF>":
            raise GraphQLSyntaxError(f"Syntax Error: Unexpected {self.peek()}.")  # one operation per request
        return op

    def type(self) -> str:
        if self.peek() == "[":
            self.take("[")
            inner = self.type()
            self.take("]")
            text = f"[{inner}]"
        else:
            text = self.name()
        if self.peek() == "!":
            self.take("!")
            text += "!"
        return text

    def selection_set(self) -> list[Field]:
        self.take("{")
        fields = []
        while self.peek() != "}":
            if self.peek() == "...":
                raise GraphQLSyntaxError("Syntax Error: fragments are not supported by this fake.")
            name = self.name()
            if self.peek() == ":":  # an alias
                self.take(":")
                name = self.name()
            args: dict[str, Any] = {}
            if self.peek() == "(":
                self.take("(")
                while self.peek() != ")":
                    arg = self.name()
                    self.take(":")
                    args[arg] = self.value()
                self.take(")")
            f = Field(name, args)
            if self.peek() == "{":
                f.selections, f.has_selection = self.selection_set(), True
            fields.append(f)
        self.take("}")
        return fields

    def value(self) -> Any:
        """A value node: ("var", name), ("lit", python value), ("enum", name), ("list", [...]), ("obj", {...})."""
        tok = self.peek()
        if tok == "$":
            self.take("$")
            return ("var", self.name())
        if tok == "[":
            self.take("[")
            items = []
            while self.peek() != "]":
                items.append(self.value())
            self.take("]")
            return ("list", items)
        if tok == "{":
            self.take("{")
            obj = {}
            while self.peek() != "}":
                key = self.name()
                self.take(":")
                obj[key] = self.value()
            self.take("}")
            return ("obj", obj)
        self.take()
        if tok.startswith('"'):
            return ("lit", json.loads(tok))
        if re.fullmatch(r"-?\d+", tok):
            return ("lit", int(tok))
        if re.fullmatch(r"-?\d[\d.eE+-]*", tok):
            return ("lit", float(tok))
        if tok in ("true", "false", "null"):
            return ("lit", {"true": True, "false": False, "null": None}[tok])
        if re.fullmatch(r"[_A-Za-z][_0-9A-Za-z]*", tok):
            return ("enum", tok)
        raise GraphQLSyntaxError(f"Syntax Error: Unexpected {tok}.")


def parse(text: str) -> Operation:
    return _Parser(text).document()


def resolve(node: Any, variables: dict[str, Any]) -> Any:
    """A value node as Python, its variables filled in."""
    kind, body = node
    if kind == "var":
        return variables.get(body)
    if kind == "list":
        return [resolve(n, variables) for n in body]
    if kind == "obj":
        return {k: resolve(v, variables) for k, v in body.items()}
    return body


# ---------------------------------------------------------------- validation

def _named(type_text: str) -> str:
    return type_text.strip("[]!")


def validate(query: str, variables: dict[str, Any]) -> tuple[Operation | None, list[str]]:
    """The parsed operation and graphql-js's error messages for it (none: the request is valid)."""
    try:
        op = parse(query)
    except GraphQLSyntaxError as exc:
        return None, [str(exc)]
    errors: list[str] = []
    used: set[str] = set()
    root = "Mutation" if op.kind == "mutation" else "Query"
    _check_selections(op.selections, root, errors, used)
    where = f' by operation "{op.name}"' if op.name else ""
    in_op = f' in operation "{op.name}"' if op.name else ""
    for var in sorted(used - set(op.variables)):
        errors.append(f'Variable "${var}" is not defined{where}.')
    for var in op.variables:
        if var not in used:
            errors.append(f'Variable "${var}" is never used{in_op}.')
    if errors:
        return op, errors
    for var, declared in op.variables.items():  # coercion of the values sent
        if var not in variables:
            if declared.endswith("!"):
                errors.append(f'Variable "${var}" of required type "{declared}" was not provided.')
            continue
        problem = _coerce(variables[var], declared)
        if problem:
            errors.append(f'Variable "${var}" got invalid value {json.dumps(variables[var])[:200]}; {problem}')
    return op, errors


def _check_selections(fields: list[Field], parent: str, errors: list[str], used: set[str]) -> None:
    known = OUTPUT.get(parent, {})
    for f in fields:
        if f.name == "__typename":
            continue
        if f.name not in known:
            errors.append(f'Cannot query field "{f.name}" on type "{parent}".')
            continue
        ftype, args = known[f.name]
        for arg, node in f.args.items():
            if arg not in args:
                errors.append(f'Unknown argument "{arg}" on field "{parent}.{f.name}".')
                used.update(_variables_in(node))
                continue
            _check_literal(node, args[arg], errors, used)
        named = _named(ftype)
        if named in SCALARS:
            if f.has_selection:
                errors.append(f'Field "{f.name}" must not have a selection since type "{ftype}" has no subfields.')
        elif not f.has_selection:
            errors.append(f'Field "{f.name}" of type "{ftype}" must have a selection of subfields. '
                          f'Did you mean "{f.name} {{ ... }}"?')
        else:
            _check_selections(f.selections, named, errors, used)


def _check_literal(node: Any, type_text: str, errors: list[str], used: set[str]) -> None:
    """An argument's value written in the query: every input object field must be defined."""
    kind, body = node
    if kind == "var":
        used.add(body)
        return
    named = _named(type_text)
    if kind == "list":
        for item in body:
            _check_literal(item, type_text[1:-1] if type_text.startswith("[") else type_text, errors, used)
    elif kind == "obj":
        fields = INPUT.get(named)
        if fields is None:
            errors.append(f"Expected value of type \"{type_text}\", found an object.")
            return
        for key, value in body.items():
            if key not in fields:
                errors.append(f'Field "{key}" is not defined by type "{named}".')
                used.update(_variables_in(value))
            else:
                _check_literal(value, fields[key], errors, used)
    elif kind == "enum" and body not in ENUMS.get(named, set()):
        errors.append(f'Value "{body}" does not exist in "{named}" enum.' if named in ENUMS else
                      f"Expected value of type \"{type_text}\", found {body}.")


def _variables_in(node: Any) -> set[str]:
    kind, body = node
    if kind == "var":
        return {body}
    items = body if kind == "list" else body.values() if kind == "obj" else []
    return set().union(*(_variables_in(n) for n in items)) if items else set()


def _coerce(value: Any, type_text: str) -> str:
    """A variable's value against its declared type: the first problem, in graphql-js's words, or ""."""
    if value is None:
        return f'Expected non-nullable type "{type_text}" not to be null.' if type_text.endswith("!") else ""
    inner = type_text.rstrip("!")
    if inner.startswith("["):
        items = value if isinstance(value, list) else [value]
        return next((p for p in (_coerce(v, inner[1:-1]) for v in items) if p), "")
    fields = INPUT.get(inner)
    if fields is None:
        return ""  # a scalar or an enum: the fake does not check its value
    if not isinstance(value, dict):
        return f'Expected type "{inner}" to be an object.'
    for key, item in value.items():
        if key not in fields:
            return f'Field "{key}" is not defined by type "{inner}".'
        problem = _coerce(item, fields[key])
        if problem:
            return problem
    for key, declared in fields.items():
        if declared.endswith("!") and value.get(key) is None:
            return f'Field "{key}" of required type "{declared}" was not provided.'
    return ""
