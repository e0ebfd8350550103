"""A query answer's bytes read into samples: the typed path and the tolerant path keep
the same samples, whatever shape the server or a proxy gives."""

from __future__ import annotations

import json

import pytest

from tuimon.sources.prom_answers import NotJson, read_answer


def _answer(result: list[object], status: str = "success", kind: str = "vector") -> bytes:
    return json.dumps({"status": status, "data": {"resultType": kind,
                                                  "result": result}}).encode()


def _item(value: str, **labels: object) -> dict[str, object]:
    return {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", **labels},
            "value": [1733370000.5, value]}


def test_a_plain_answer_keeps_every_finite_sample_with_its_labels() -> None:
    error, samples = read_answer(_answer([_item("65", Hostname="n1"),
                                          _item("NaN", Hostname="n2"),
                                          _item("+Inf", Hostname="n3"),
                                          _item("1e400", Hostname="n4"),
                                          _item("not a number", Hostname="n5"),
                                          _item("-2.5", Hostname="n6")]))
    assert error is None
    assert samples == [({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n1"},
                        65.0),
                       ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n6"},
                        -2.5)]


def test_an_odd_item_costs_only_itself() -> None:
    """A label that is not a string, an item without a value, a value of another shape:
    the rest of the answer is read (by the tolerant path)."""
    error, samples = read_answer(_answer([
        _item("1", Hostname="n1"), _item("2", Hostname=7), {"metric": {"a": "b"}},
        {"metric": {"a": "b"}, "value": "x"}, _item("3", Hostname="n3"), 5]))
    assert error is None
    assert [(labels["Hostname"], value) for labels, value in samples or []] == [
        ("n1", 1.0), ("7", 2.0), ("n3", 3.0)]


def test_an_error_answer_is_given_back_to_say_why() -> None:
    body = json.dumps({"status": "error", "errorType": "bad_data",
                       "error": "parse error at char 3"}).encode()
    parsed, samples = read_answer(body)
    assert samples is None and parsed["error"] == "parse error at char 3"


@pytest.mark.parametrize("kind", ["matrix", "scalar", "string"])
def test_another_result_type_is_no_samples(kind: str) -> None:
    assert read_answer(_answer([1733370000, "5"], kind=kind)) == (None, [])


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("body", [
    b"<html>502 Bad Gateway</html>", b'{"status": "succ', DEEP, b"",
    # nested past any parser's depth inside a field the typed path skips or reads
    b'{"status":"success","warnings":' + DEEP + b',"data":{"resultType":"vector",'
    b'"result":[]}}',
    b'{"status":"error","error":' + DEEP + b"}"])
def test_what_is_not_json_says_so(body: bytes) -> None:
    with pytest.raises(NotJson):
        read_answer(body)
