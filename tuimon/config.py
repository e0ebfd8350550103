"""`~/.config/tuimon/config.toml`: named clusters, so `tuimon --cluster prod` is enough.

    [clusters.prod]
    targets = ["gpu[001-128]:9477"]      # or targets_file = "/etc/tuimon/targets"
                                          # or relay = "login1:9478"
                                          # or prometheus = "http://prom:9090"
                                          #    (with match = 'cluster="prod"',
                                          #     node_labels = ["k8s_node"],
                                          #     [clusters.prod.node_aliases] "10.0.0.5" =
                                          #     "gpu005": how Prometheus series name nodes)
    token_file = "~/.config/tuimon/prod.token"
    tls = true
    tls_ca = "/etc/tuimon/ca.pem"
    topology = "/etc/slurm/topology.conf"  # or [clusters.prod.leaves] leaf01 = "gpu[001-016]"
    theme = "tuimon-cividis"
    slo_target = 0.9
    slo_hours = 720                       # or slo_days = 30
    [clusters.prod.baselines]             # samples/s of one GPU, per job
    llm-pretrain = 31.5
    [clusters.prod.provisioned]           # GB/s per shared file system
    "/lustre/scratch" = 400

Every setting is also a command-line flag, and a flag wins. A malformed file is an error
naming the file, the line and the key.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ConfigFileError(ValueError):
    """`FILE:LINE: KEY: problem`."""


KEYS: dict[str, type | tuple[type, ...]] = {
    "targets": list, "targets_file": str, "token_file": str, "tls": bool, "tls_ca": str,
    "tls_insecure": bool, "topology": str, "leaves": dict, "theme": str,
    "slo_target": (int, float), "slo_hours": (int, float), "slo_days": (int, float),
    "baselines": dict, "flops_per_sample": dict, "provisioned": dict, "name": str,
    "relay": str, "prometheus": str, "match": str, "node_labels": list, "node_aliases": dict,
    "cpu_nodes": str,
}


@dataclass
class ClusterConfig:
    name: str
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuimon" / "config.toml"


def _line_of(text: str, key: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(rf'\s*"?{re.escape(key)}"?\s*=', line) or \
                re.match(rf"\s*\[[^\]]*\b{re.escape(key)}\s*\]", line):
            return i
    return 0


def load(path: Path | None = None) -> dict[str, ClusterConfig]:
    path = path or default_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigFileError(f"{path}:{m.group(1) if m else '?'}: not valid TOML: {exc}") \
            from None
    clusters = data.get("clusters", {})
    if not isinstance(clusters, dict):
        raise ConfigFileError(f"{path}:{_line_of(text, 'clusters')}: clusters: expected a "
                              "table of named clusters")
    unknown_top = set(data) - {"clusters"}
    if unknown_top:
        key = sorted(unknown_top)[0]
        raise ConfigFileError(f"{path}:{_line_of(text, key)}: {key}: unknown setting "
                              "(settings go under [clusters.NAME])")
    out: dict[str, ClusterConfig] = {}
    for name, values in clusters.items():
        if not isinstance(values, dict):
            raise ConfigFileError(f"{path}:{_line_of(text, name)}: clusters.{name}: expected "
                                  "a table")
        for key, value in values.items():
            where = f"{path}:{_line_of(text, key)}: clusters.{name}.{key}"
            expected = KEYS.get(key)
            if expected is None:
                raise ConfigFileError(f"{where}: unknown setting; known: "
                                      f"{', '.join(sorted(KEYS))}")
            if not isinstance(value, expected) or (expected == (int, float) and
                                                   isinstance(value, bool)):
                raise ConfigFileError(f"{where}: expected {_words(expected)}, got "
                                      f"{type(value).__name__} {value!r}"[:200])
            if isinstance(value, dict) and key != "leaves" and not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                    for v in value.values()):
                raise ConfigFileError(f"{where}: values must be positive numbers")
        if "slo_target" in values and not 0 < values["slo_target"] < 1:
            raise ConfigFileError(f"{path}:{_line_of(text, 'slo_target')}: "
                                  f"clusters.{name}.slo_target: must be between 0 and 1")
        out[name] = ClusterConfig(name, dict(values))
    return out


def _words(t: type | tuple[type, ...]) -> str:
    names = {list: "a list", str: "a string", bool: "true or false", dict: "a table"}
    if isinstance(t, tuple):
        return "a number"
    return names.get(t, t.__name__)
