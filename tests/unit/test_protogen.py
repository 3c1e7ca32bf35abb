"""The committed generated code matches proto/ (make proto regenerates it)."""

from pathlib import Path

from ncclwatch import protogen


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = protogen.generate(tmp_path)
    assert {p.name for p in fresh} == set(protogen.OUTPUTS)
    committed = protogen.ROOT / "ncclwatch" / "v1"
    for p in fresh:
        assert (committed / p.name).read_bytes() == p.read_bytes(), (
            f"ncclwatch/v1/{p.name} is stale: run `make proto` and commit the result")


def test_enums_follow_buf_style() -> None:
    from ncclwatch.v1 import collector_pb2 as pb

    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.name}: value 0 is {zero}"
