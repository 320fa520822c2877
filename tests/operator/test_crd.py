"""The CRD: a structural v1 schema whose required fields and patterns agree with the spec parser."""

from __future__ import annotations

import re

from kvpool_operator.crd import GROUP, PLURAL, build_crd
from kvpool_operator.spec import NAME_RE, QUANTITY_RE, quantity


def test_the_crd_is_namespaced_versioned_with_status_and_printer_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}" == "colocatedmodels.kvpool.dev"
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Budget",
        "Ready",
        "Balanced",
        "Degraded",
        "Age",
    ]


def test_schema_required_fields_and_patterns_match_the_parser() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["gpuMemoryBudgetBytes", "models"]
    model = spec["properties"]["models"]["items"]
    assert model["required"] == ["name", "model", "minBytes", "maxBytes"]
    assert model["properties"]["name"]["pattern"] == NAME_RE.pattern
    assert spec["properties"]["gpuMemoryBudgetBytes"]["pattern"] == QUANTITY_RE.pattern
    for text in ("40Gi", "512Mi", "7"):  # what the schema admits, the parser reads
        assert re.match(QUANTITY_RE.pattern, text)
        assert quantity(text, "x") > 0


def test_every_object_in_the_schema_is_structural() -> None:
    def walk(node: dict[str, object], path: str) -> None:
        assert (
            "type" in node or node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
        for key, child in (node.get("properties") or {}).items():  # type: ignore[union-attr]
            walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")  # type: ignore[arg-type]

    walk(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
