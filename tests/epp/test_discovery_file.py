"""The static discovery file: llm-d's `{name, namespace, address, port, labels}` list, validated,
reloaded when its bytes change, and an invalid edit keeps the last good set with one log line."""

from __future__ import annotations

import asyncio
import logging

import pytest

from talariad.epp.discovery import BoxEndpoint, endpoints
from talariad.epp.discovery.file import DiscoveryError, FileSource, parse_boxes

GOOD = """
- {name: box-a, address: 10.0.0.5, port: 8000}
- {name: box-b, namespace: pool, address: "fd00::7", port: 8001, labels: {rack: r2}}
- {name: box-c, address: box-c.lan, port: 65535}
"""


def test_a_good_file_names_its_boxes():
    boxes = parse_boxes(GOOD)
    assert boxes == {
        "box-a": BoxEndpoint("box-a", "10.0.0.5", 8000),
        "box-b": BoxEndpoint("box-b", "fd00::7", 8001),
        "box-c": BoxEndpoint("box-c", "box-c.lan", 65535),
    }
    assert endpoints(boxes) == {
        "box-a": "10.0.0.5:8000",
        "box-b": "[fd00::7]:8001",
        "box-c": "box-c.lan:65535",
    }


def test_the_list_may_sit_under_endpoints_and_may_be_empty():
    assert parse_boxes("endpoints:\n- {name: a, address: 10.0.0.1, port: 80}\n") == {
        "a": BoxEndpoint("a", "10.0.0.1", 80)
    }
    assert parse_boxes("[]") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- {name: a, address: 10.0.0.1, port: [\n", "not YAML"),
        ("", "the file is empty"),
        ("name: a\n", "expected a list"),
        ("- {name: a, address: 10.0.0.1, port: 0}\n", "entry 0 (a): port"),
        ("- {name: a, address: 10.0.0.1, port: 70000}\n", "port"),
        ("- {name: a, address: 10.0.0.1, port: '80'}\n", "port"),
        ("- {name: a, address: 10.0.0.300, port: 80}\n", "address"),
        (
            "- {name: a, address: 'bad host!', port: 80}\n",
            "neither an IPv4/IPv6 address nor a hostname",
        ),
        ("- {name: a, adress: 10.0.0.1, port: 80}\n", "entry 0 (a)"),
        ("- {name: '', address: 10.0.0.1, port: 80}\n", "name"),
        ("- 10.0.0.1:80\n", "entry 0"),
        (
            "- {name: a, address: 10.0.0.1, port: 80}\n- {name: a, address: 10.0.0.2, port: 80}\n",
            "appears twice",
        ),
    ],
)
def test_a_bad_file_is_one_line_saying_why(text, says):
    with pytest.raises(DiscoveryError) as err:
        parse_boxes(text)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_edits_are_seen_and_a_bad_edit_keeps_the_last_good_set(tmp_path, caplog):
    path = tmp_path / "pool.yaml"
    path.write_text(GOOD)
    source = FileSource(path)
    assert set(source.poll()) == {"box-a", "box-b", "box-c"}
    assert source.poll() is None  # unchanged

    path.write_text("- {name: box-a, address: 10.0.0.5, port: 8000}\n")
    assert set(source.poll()) == {"box-a"}

    path.write_text("- {name: box-a, address: 10.0.0.5, port: 99999}\n")
    assert source.poll() is None and source.poll() is None
    [line] = _warnings(caplog)
    assert "port" in line and "keeping the last good 1" in line and str(path) in line

    path.write_text("")  # an editor's truncate-then-write caught half way
    assert source.poll() is None
    path.unlink()
    assert source.poll() is None and source.poll() is None
    assert len(_warnings(caplog)) == 3 and "cannot read it" in _warnings(caplog)[-1]

    path.write_text("- {name: box-a, address: 10.0.0.5, port: 8000}\n")
    assert source.poll() is None  # back to the set already published
    path.write_text("[]\n")
    assert source.poll() == {}  # said on purpose: the pool is empty


async def test_changes_yields_the_first_set_then_each_new_one(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text("not: [a, list]\n")  # nothing good yet: nothing yielded
    changes = FileSource(path, interval=0.01).changes()
    first = asyncio.ensure_future(anext(changes))
    await asyncio.sleep(0.05)
    assert not first.done()
    path.write_text(GOOD)
    assert set(await asyncio.wait_for(first, 5)) == {"box-a", "box-b", "box-c"}
    path.write_text(GOOD.replace("8000", "9000"))
    assert (await asyncio.wait_for(anext(changes), 5))["box-a"].port == 9000
    await changes.aclose()
