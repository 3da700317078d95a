"""jobgen.planning.cache: derived data kept between renders, never a rendered result; a broken cache is a
miss, never an error; renders are byte-identical with the cache cold, warm or off."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobgen.backends.kubernetes import validate as kv
from jobgen.planning import cache
from jobgen.planning.render import _referenced_templates, environment, render_template, template_sha256


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("JOBGEN_CACHE_DIR", str(directory))
    return directory


def _counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_value_is_computed_once_and_then_read(cache_dir):
    compute, calls = _counting({"a": [1, 2.5, None, "x"]})
    key = cache.content_key(b"bytes", "v1")
    assert cache.cached_json("ns", key, compute) == {"a": [1, 2.5, None, "x"]}
    assert cache.cached_json("ns", key, compute) == {"a": [1, 2.5, None, "x"]}
    assert len(calls) == 1
    assert [p.name for p in (cache_dir / "ns").iterdir()] == [f"{key}.json"]  # no temporary file left


def test_keys_cover_every_part_and_its_boundaries():
    assert cache.content_key("ab", "c") != cache.content_key("a", "bc")
    assert cache.content_key(b"x") == cache.content_key("x")
    assert cache.content_key("x") != cache.content_key("y")


def test_a_corrupt_entry_is_a_miss(cache_dir):
    key = cache.content_key("k")
    (cache_dir / "ns").mkdir(parents=True)
    (cache_dir / "ns" / f"{key}.json").write_text('{"half": ')
    compute, calls = _counting([1])
    assert cache.cached_json("ns", key, compute) == [1]
    assert calls == [1]
    assert cache.cached_json("ns", key, compute) == [1] and calls == [1]  # rewritten whole


def test_a_cache_path_that_is_a_file_is_not_an_error(tmp_path, monkeypatch):
    """A regular file where the directory should be cannot be written into, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.setenv("JOBGEN_CACHE_DIR", str(blocker))
    compute, calls = _counting(7)
    assert cache.cached_json("ns", "k", compute) == 7
    assert cache.cached_json("ns", "k", compute) == 7 and len(calls) == 2


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGEN_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    compute, calls = _counting(1)
    cache.cached_json("ns", "k", compute)
    cache.cached_json("ns", "k", compute)
    assert len(calls) == 2 and not (tmp_path / "xdg").exists()
    assert cache.template_bytecode_cache() is None


def test_default_location_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("JOBGEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "jobgen"


def test_compiled_templates_are_reused_and_an_edit_is_compiled_again(cache_dir, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.j2").write_text("hello {{ who }}\n")
    assert render_template(templates, "t.j2", who="a") == "hello a\n"
    assert len(list((cache_dir / "jinja2").iterdir())) == 1
    environment.cache_clear()  # a new process: a fresh Environment reading the same cache
    assert render_template(templates, "t.j2", who="b") == "hello b\n"
    (templates / "t.j2").write_text("bye {{ who }}\n")
    environment.cache_clear()
    assert render_template(templates, "t.j2", who="c") == "bye c\n"  # the checksum no longer matches


def test_a_corrupt_compiled_template_is_compiled_again(cache_dir, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.j2").write_text("x={{ x }}\n")
    render_template(templates, "t.j2", x=1)
    for entry in (cache_dir / "jinja2").iterdir():
        entry.write_bytes(entry.read_bytes()[:20])
    environment.cache_clear()
    assert render_template(templates, "t.j2", x=2) == "x=2\n"


def test_template_references_come_from_the_cache_in_a_new_process(cache_dir, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "_inc.j2").write_text("inc\n")
    (templates / "a.j2").write_text('a {% include "_inc.j2" %}\n')
    first = template_sha256(str(templates), "a.j2")
    assert sorted(p.name for p in (cache_dir / "template-refs").iterdir())  # one entry per source
    template_sha256.cache_clear()
    _referenced_templates.cache_clear()
    environment.cache_clear()
    assert template_sha256(str(templates), "a.j2") == first


def test_crd_schema_is_derived_once_and_the_cached_copy_validates_alike(cache_dir):
    kind = "PyTorchJob"
    path = kv.crd_file(kind, kv.PACKAGED_CRDS_DIR)
    version = kv.CRD_FILES[kind][3]
    kv._crd_validator.cache_clear()
    cold = kv._crd_validator(str(path), path.stat().st_mtime_ns, version)
    entries = list((cache_dir / "crd-schema").iterdir())
    assert len(entries) == 1
    kv._crd_validator.cache_clear()
    warm = kv._crd_validator(str(path), path.stat().st_mtime_ns, version)
    assert warm.schema == cold.schema
    bad = {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": {"name": "x"},
           "spec": {"pytorchReplicaSpecs": {}, "runPolicyy": {}}}
    assert sorted(e.message for e in warm.iter_errors(bad)) == sorted(e.message for e in cold.iter_errors(bad))
    assert any("runPolicyy" in e.message for e in warm.iter_errors(bad))
    kv._crd_validator.cache_clear()


@pytest.mark.parametrize("profile", ["k8s-h100", "slurm-a100"])
def test_renders_are_byte_identical_with_the_cache_cold_warm_and_off(run_cli, tmp_path, monkeypatch, profile):
    from tests.conftest import EXAMPLES

    outputs = []
    for setting in (str(tmp_path / "c"), str(tmp_path / "c"), "off"):
        monkeypatch.setenv("JOBGEN_CACHE_DIR", setting)  # each render is a new process
        result = run_cli("render", str(EXAMPLES / "quickstart.yaml"), "-p", profile, "--stdout")
        assert result.code == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert (tmp_path / "c" / "jinja2").is_dir()
