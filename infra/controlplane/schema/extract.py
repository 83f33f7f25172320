"""Writes microsoft.web-<api-version>.jsonc beside this file from the azure-mgmt-web package's models.

azure-mgmt-web is generated from azure-rest-api-specs, so its models are the Microsoft.Web REST schema:
each model's property names (as sent on the wire) and each enum's allowed values. tests/test_infra.py
checks the Bicep template's Microsoft.Web resources against this file (there is no Bicep compiler here).
Plain JSON, named .jsonc so that azure-functions-doctor, which reads every *.json as infrastructure, does not
take the schema's list of properties (linuxFxVersion among them) for this app's settings.

    pip download --no-deps azure-mgmt-web==11.0.1 -d /tmp/web && unzip -q /tmp/web/*.whl -d /tmp/web/pkg
    python infra/controlplane/schema/extract.py /tmp/web/pkg
"""

from __future__ import annotations

import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

ROOTS = ("Site", "AppServicePlan")


def main(package_root: str) -> None:
    sys.path.insert(0, package_root)
    import azure.mgmt.web.models as models  # type: ignore[import-not-found]
    from azure.mgmt.web import _configuration  # type: ignore[import-not-found]
    from azure.mgmt.web.models import _models  # type: ignore[import-not-found]

    out: dict[str, dict[str, Any]] = {}

    def describe(hint: Any) -> Any:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is typing.Union:
            enums = [a for a in args if isinstance(a, type) and issubclass(a, enum.Enum)]
            if enums:
                return {"enum": sorted(v.value for v in enums[0])}
            return describe(args[0])
        if typing.get_origin(hint) is list:
            return {"list": describe(args[0])}
        if typing.get_origin(hint) is dict:
            return {"map": describe(args[1])}
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return {"enum": sorted(v.value for v in hint)}
        if isinstance(hint, type) and hint.__module__.endswith("_models"):
            walk(hint)
            return hint.__name__
        return getattr(hint, "__name__", str(hint))

    def walk(cls: type) -> None:
        if cls.__name__ in out:
            return
        out[cls.__name__] = {}
        cls()  # the model base fills _attr_to_rest_field on first use
        hints = typing.get_type_hints(cls, {**vars(_models), "_models": models}, None)
        out[cls.__name__] = {field._rest_name: describe(hints.get(attr))
                             for attr, field in cls._attr_to_rest_field.items()}  # type: ignore[attr-defined]

    for root in ROOTS:
        walk(getattr(models, root))
    source = Path(_configuration.__file__).read_text()
    version = source.split('api_version: str = kwargs.pop("api_version", "', 1)[1].split('"', 1)[0]
    doc = {"_source": f"azure-mgmt-web (PyPI), generated from azure-rest-api-specs Microsoft.Web api-version {version}: "
                      "each model's REST property names and, for enums, the allowed values. Regenerate with "
                      "infra/controlplane/schema/extract.py.", "api_version": version, "models": out}
    target = Path(__file__).with_name(f"microsoft.web-{version}.jsonc")
    target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(target)


if __name__ == "__main__":
    main(sys.argv[1])
