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

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuimon_core.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ConfigFileError(UsageError, ValueError):
    """`FILE:LINE: KEY: problem`."""


KEYS: dict[str, type | tuple[type, ...]] = {
    "targets": list, "targets_file": str, "token_file": str, "tls": bool, "tls_ca": str,
    "tls_insecure": bool, "topology": str, "leaves": dict, "theme": str,
    "slo_target": (int, float), "slo_hours": (int, float), "slo_days": (int, float),
    "baselines": dict, "flops_per_sample": dict, "provisioned": dict, "name": str,
    "relay": str, "prometheus": str, "match": str, "node_labels": list, "node_aliases": dict,
    "cpu_nodes": str,
}


# Numeric settings and their largest value, as their flags take them (inf and NaN fail
# every comparison and are refused with the rest).
NUMBER_LIMITS: dict[str, float] = {"slo_hours": 1e6, "slo_days": 36500.0}


@dataclass(frozen=True)
class ClusterConfig:
    """One `[clusters.NAME]` table, checked: each setting with its type, None or empty
    when the file does not set it."""

    name: str
    display_name: str | None = None  # `name = "..."`: shown in the header
    targets: tuple[str, ...] = ()
    targets_file: str | None = None
    relay: str | None = None
    prometheus: str | None = None
    match: str | None = None
    node_labels: tuple[str, ...] = ()
    node_aliases: dict[str, str] = field(default_factory=dict)
    token_file: str | None = None
    tls: bool = False
    tls_ca: str | None = None
    tls_insecure: bool = False
    topology: str | None = None
    leaves: dict[str, str] = field(default_factory=dict)
    theme: str | None = None
    slo_target: float | None = None
    slo_hours: float | None = None  # from slo_hours, or slo_days x 24
    baselines: dict[str, float] = field(default_factory=dict)
    flops_per_sample: dict[str, float] = field(default_factory=dict)
    provisioned: dict[str, float] = field(default_factory=dict)
    cpu_nodes: str | None = None

    @classmethod
    def from_table(cls, name: str, v: dict[str, Any]) -> ClusterConfig:
        """From a table `load` has checked key by key."""
        hours = v.get("slo_hours")
        if hours is None and v.get("slo_days") is not None:
            hours = 24.0 * float(v["slo_days"])
        return cls(
            name=name, display_name=v.get("name"),
            targets=tuple(str(t) for t in v.get("targets", ())),
            targets_file=v.get("targets_file"), relay=v.get("relay"),
            prometheus=v.get("prometheus"), match=v.get("match"),
            node_labels=tuple(str(x) for x in v.get("node_labels", ())),
            node_aliases={str(k): str(x) for k, x in v.get("node_aliases", {}).items()},
            token_file=v.get("token_file"), tls=bool(v.get("tls", False)),
            tls_ca=v.get("tls_ca"), tls_insecure=bool(v.get("tls_insecure", False)),
            topology=v.get("topology"),
            leaves={str(k): str(x) for k, x in v.get("leaves", {}).items()},
            theme=v.get("theme"),
            slo_target=float(v["slo_target"]) if "slo_target" in v else None,
            slo_hours=float(hours) if hours is not None else None,
            baselines={k: float(x) for k, x in v.get("baselines", {}).items()},
            flops_per_sample={k: float(x) for k, x in v.get("flops_per_sample", {}).items()},
            provisioned={k: float(x) for k, x in v.get("provisioned", {}).items()},
            cpu_nodes=v.get("cpu_nodes"))


def cluster_defaults(c: ClusterConfig) -> dict[str, Any]:
    """The cluster's settings as defaults for the command line's options (argparse
    destinations). Flags typed by the user then win whatever their value; list options
    (`--baseline`, `--provisioned`, `--node-label`, `--node-alias`) add to the file's."""

    def home(v: str | None) -> str | None:
        return str(Path(v).expanduser()) if v else None

    out: dict[str, Any] = {
        "name": c.display_name or c.name,
        "targets_file": home(c.targets_file), "token_file": home(c.token_file),
        "tls_ca": home(c.tls_ca), "topology": home(c.topology),
        "tls": c.tls, "tls_insecure": c.tls_insecure, "theme": c.theme,
        "match": c.match or "", "cpu_nodes": c.cpu_nodes or "",
        "node_label": list(c.node_labels),
        "node_alias": [f"{k}={v}" for k, v in c.node_aliases.items()],
        "baseline": [f"{k}={v}" for k, v in c.baselines.items()],
        "flops_per_sample": [f"{k}={v}" for k, v in c.flops_per_sample.items()],
        "provisioned": [f"{k}={v}" for k, v in c.provisioned.items()],
        "leaves": dict(c.leaves),
    }
    if c.slo_target is not None:
        out["slo_target"] = c.slo_target
    if c.slo_hours is not None:
        out["slo_hours"] = c.slo_hours
    return out


def set_cluster_defaults(parser: argparse.ArgumentParser, defaults: dict[str, Any],
                         commands: tuple[str, ...] = ("connect", "status", "prom", "rules",
                                                      "report"),
                         ) -> None:
    """Make `defaults` the defaults of those subcommands, each for the options it has
    (and `leaves`, which has no flag, where there is a topology)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for command in commands:
            sub = action.choices[command]
            dests = {a.dest for a in sub._actions}
            sub.set_defaults(**{k: v for k, v in defaults.items()
                                if k in dests or (k == "leaves" and "topology" in dests)})


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
    except RecursionError:
        raise ConfigFileError(f"{path}: not a config file: tables or arrays nested deeper "
                              "than Python reads") from None
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
            # Tables of names (leaves, node aliases) hold strings; the others numbers.
            if isinstance(value, dict) and key in ("leaves", "node_aliases"):
                if not all(isinstance(v, str) for v in value.values()):
                    raise ConfigFileError(f"{where}: values must be strings")
            elif isinstance(value, dict) and not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool)
                    and 0 < v < math.inf for v in value.values()):
                raise ConfigFileError(f"{where}: values must be positive finite numbers")
            # The same bounds as the flags' (tuimon.cli): a file is typed input too.
            limit = NUMBER_LIMITS.get(key)
            if limit is not None and not 0 < value <= limit:
                raise ConfigFileError(f"{where}: must be a positive number of at most "
                                      f"{limit:g}, got {value!r}")
        if "slo_target" in values and not 0 < values["slo_target"] < 1:
            raise ConfigFileError(f"{path}:{_line_of(text, 'slo_target')}: "
                                  f"clusters.{name}.slo_target: must be between 0 and 1")
        out[name] = ClusterConfig.from_table(name, values)
    return out


def _words(t: type | tuple[type, ...]) -> str:
    names = {list: "a list", str: "a string", bool: "true or false", dict: "a table"}
    if isinstance(t, tuple):
        return "a number"
    return names.get(t, t.__name__)
