"""Diagnosis: what is wrong, where, and how bad, judged over windows with hysteresis.

Node-local rules (tuimon_core.node_rules: GPUs, links, port errors, NFS latency, step
reports) run on each node's own frames; cluster rules here compare nodes (lost nodes,
congestion by leaf, spine, node or port, provisioned storage throughput, stragglers,
efficiency drops with ranked causes, burn). Rules produce conditions; a FindingBook
holds each finding while its condition lasts and clears it with hysteresis, so a
snapshot taken at any second tells the same story. Every finding names its component
in fields (node, GPU, port, leaf, file system, job).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from tuimon.model.attribution import likely
from tuimon.model.cluster import ClusterState, no_data_note, relay_lost_text
from tuimon.model.efficiency import WINDOWS, EfficiencyView
from tuimon.model.guard import Guard
from tuimon.model.node_state import NodeState
from tuimon.model.storage import StorageView, near_provisioned
from tuimon_core.efficiency_drop import DropJudge
from tuimon_core.findings import KINDS, SEVERITY_ORDER, Finding, FindingBook, sort_key
from tuimon_core.findings_family import findings_from_wire
from tuimon_core.fleet import fleet_findings, hellos_of
from tuimon_core.hostlist import collect_hostlist, hostlist_within
from tuimon_core.node_rules import CONGESTED_WAIT, OUTLIER_FACTOR, NodeRules
from tuimon_core.node_states import UP
from tuimon_core.protocol.fields import MAX_FINDING_TEXT
from tuimon_core.protocol.overview_layout import port_waits
from tuimon_core.protocol.text import clean
from tuimon_core.wording import plural

__all__ = ["SEVERITY_ORDER", "Diagnosis", "Finding", "sort_key"]



def _median(values: list[float]) -> float:
    """statistics.median, without its per-call overhead (run per node per second)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# A node judged here is judged again without a new sample this long after the last
# time: a window that ends clears its finding at most this late (beside the minute or
# more of the finding's own hysteresis), whatever the node's interval.
REJUDGE_S = 15.0

# What can make one rank slower than its peers, found on its node at the same time.
STRAGGLER_CAUSES = frozenset(name for name, k in KINDS.items() if k.slows_rank)


def _cause(f: Finding) -> str:
    """A cause in a few words: its kind and what it says, less the node it names."""
    text = f.message
    for prefix in (f.where, f.node or ""):
        if prefix and text.startswith(prefix):
            text = text[len(prefix):].lstrip(" :")
            break
    return f"{f.kind.replace('_', ' ')} ({text})"


# Of nodes unreached for different reasons, at most this many reasons are each said
# with the nodes they hold (the most nodes first), each reason in at most REASON_CHARS
# characters; the nodes of the others are named together, or counted where naming them
# would take the text past what a finding carries on the wire (MAX_FINDING_TEXT).
UNREACHED_REASONS_SAID = 3
REASON_CHARS = 100
_TAIL_ROOM = 48  # "; 4,096 more nodes (12 other reasons)"
NO_ANSWER = "no answer yet"  # a node not refused, not timed out: not answered so far


def _reason_text(reason: str | None) -> str:
    if not reason:
        return NO_ANSWER
    # Cleaned before it is measured: the wire escapes what is not printable, and a
    # reason made longer there would push the text past its bound and lose its end.
    reason = clean(reason)
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 3] + "..."


def unreached(nodes: list[NodeState], what: str = "never reached") -> Finding:
    """Nodes the viewer never heard from, as one finding with their names as a host list
    and the reason (the same for all, usually). Where the reasons differ (one host down,
    another refusing, a third not answered yet), each of the first few is said with its
    own hosts: "2 different reasons" alone sends the on-call to the log. `nodes`: at
    least one."""
    assert nodes, "a finding of no unreached node"
    names = sorted(n.name for n in nodes)
    head = f"{plural(len(names), 'node')} {what}: "
    by_reason: dict[str, list[str]] = {}
    for n in nodes:  # grouped as shown: two reasons alike in their first 97 are one
        by_reason.setdefault(_reason_text(n.reason), []).append(n.name)
    if len(by_reason) <= 1:
        why = f" ({next(iter(by_reason))})"
        hosts = hostlist_within(names, MAX_FINDING_TEXT - len(head) - len(why))
        return Finding("critical", "unreached", f"{head}{hosts}{why}", nodes=tuple(names))
    waiting = by_reason.pop(NO_ANSWER, [])
    groups = sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if waiting:
        groups.append((NO_ANSWER, waiting))
    said: list[str] = []
    room = MAX_FINDING_TEXT - len(head) - _TAIL_ROOM
    left = groups
    for i, (why, held) in enumerate(groups):
        hosts = collect_hostlist(sorted(held))
        if not said and len(hosts) + len(why) + 5 > room:
            # The first group is said whatever its size: its hosts cut to leave room for
            # its reason, the next group with its own where that is short (a host or
            # two), and the rest's count.
            after = len(collect_hostlist(sorted(groups[1][1]))) + len(groups[1][0]) + 5
            hosts = hostlist_within(held, room - len(why) - 5
                                    - (after if after <= room // 3 else 0))
        part = f"{hosts} ({why})"
        if said and (i == UNREACHED_REASONS_SAID or len(part) + 2 > room):
            break
        said.append(part)
        room -= len(part) + 2
        left = groups[i + 1:]
    if left:
        rest = sorted(name for _, held in left for name in held)
        others = plural(len(left), "other reason")
        named = f"{collect_hostlist(rest)} ({others})"
        said.append(named if len(named) <= room + _TAIL_ROOM - 2 else
                    f"{plural(len(rest), 'more node')} ({others})")
    return Finding("critical", "unreached", head + "; ".join(said), nodes=tuple(names))


# What the viewer finds of its own sources (a scrape, a relay, Prometheus), not of the
# cluster: the first findings of every pass.
SOURCE_KINDS = frozenset(name for name, k in KINDS.items() if k.source)


def gpus_unseen(cluster: ClusterState, cpu_nodes: frozenset[str] | set[str]) -> list[NodeState]:
    """The up nodes whose agent sees no GPU where GPUs are expected: not a known CPU
    node, and GPUs on its PCI bus, or a reason NVML gives (it failed to start, the
    driver is gone). Where the NVML library is simply not installed, only if other
    nodes of the cluster have GPUs."""
    gpus_elsewhere = any(n.gpu_count for n in cluster.nodes.values())
    out = []
    for n in cluster.nodes.values():
        h = n.hello
        if n.status != UP or h is None or h.gpus or n.name in cpu_nodes:
            continue
        if h.extra.get("pci_gpus"):
            out.append(n)
        elif h.gpu_status and ("Library Not Found" not in h.gpu_status or gpus_elsewhere):
            out.append(n)  # (no library, no GPU elsewhere: a CPU-only cluster or node)
    return out


class Diagnosis:
    def __init__(self, topology: dict[str, str] | None = None,
                 wall: Callable[[], float] = time.time,
                 cpu_nodes: set[str] | frozenset[str] = frozenset()) -> None:
        self.topology = dict(topology or {})
        # Nodes known to have no GPU (login nodes): no GPU there is no fault.
        self.cpu_nodes = frozenset(cpu_nodes)
        self.findings: list[Finding] = []
        self.book = FindingBook()
        self._rules: dict[str, NodeRules] = {}
        # job -> the judge of its drop, for jobs whose nodes do not judge it themselves.
        self._drops: dict[str, DropJudge] = {}
        self.wall = wall  # the judgement's clock (Unix time; a replay's own)
        # Parts of the judgement that failed (a bug), shown as internal_error findings.
        self.guard = Guard()
        # (the cluster's hellos version, the fleet findings then)
        self._fleet_seen: tuple[int, list[Finding]] = (-1, [])
        # target -> (its conditions as last read, its name then, the findings they say)
        self._read_conditions: dict[str, tuple[list[Any], str, list[Finding]]] = {}
        # target -> what the node rules judged here last: (the sample, the hello, the
        # node's status, when, the findings)
        self._judged: dict[str, tuple[Any, Any, str, float, list[Finding]]] = {}
        # What the last pass with data found of the cluster (not of its sources): kept as
        # unknown while the source everything comes from is gone.
        self._last_known: list[Finding] = []
        # The unreached finding as last made, with the (name, reason) of its nodes.
        self._unreached: tuple[tuple[tuple[str, str | None], ...], Finding] | None = None

    def update(self, cluster: ClusterState, eff: EfficiencyView,
               storage: StorageView) -> list[Finding]:
        now = self.wall()
        out: list[Finding] = []
        run = self.guard.run  # each rule alone: a bug in one loses no other finding
        # The viewer's own: what it sees of its sources (a scrape, a relay).
        out += [Finding("critical", "scrape_failed", reason, node=node, target=target)
                for target, (node, reason) in cluster.scrape_failures.items()]
        out += [Finding("warning", "relay_refused", text, target=f"{relay} ({key})")
                for relay, problems in cluster.relay_problems.items()
                for key, text in problems.items()]
        out += [Finding("warning", "source_limit", text, target=source)
                for source, text in cluster.source_limits.items()]
        # The onset is the finding's `first_seen`, which every reader shows in its own
        # words (status: "since 02:13 (5 min)"), not the message: said once.
        out += [Finding("critical", "relay_lost", relay_lost_text(relay, reason, len(names)),
                        target=relay, nodes=names, score=0.5, first_seen=since)
                for relay, (reason, since, names) in cluster.lost_relays.items()]
        out += [Finding("critical", "source_lost",
                        f"{reason}; " + (f"its {plural(count, 'node')} unknown" if count else
                                         "no node read from it yet"),
                        target=source, score=0.5, first_seen=since)
                for source, (reason, since, count) in cluster.lost_sources.items()]
        if cluster.lost_sources:
            # The source every node comes from is gone (Prometheus): what was found is not
            # known to have cleared; kept, saying since when there is no data, and the
            # book left as it was, so nothing is held anew or said cleared when it is back.
            since = min(s for _, s, _ in cluster.lost_sources.values())
            note = no_data_note(since, "its source is unreachable")
            self.findings = sorted(
                out + [replace(f, message=f.message + note) for f in self._last_known],
                key=sort_key)
            return self.findings
        relayed = cluster.relayed_findings()
        if relayed is not None:
            # Every node is carried by a relay that judges it around the clock: its
            # findings, held from their true onsets, are the cluster's; this viewer does
            # not judge again from the moment it connected.
            self.findings = sorted(self.book.update(out, now) + relayed, key=sort_key)
            return self.findings
        out += run("the lost-node rule", lambda: self._nodes(cluster), [])
        out += self._node_local(cluster, now)
        out += run("the GPU-init rule", lambda: self._gpu_init(cluster), [])
        local = [f for f in out if f.kind == "congestion" and f.node is not None]
        out += run("the congestion rules", lambda: self._congestion(cluster, local), [])
        out += run("the storage rule", lambda: self._storage(storage), [])
        out += run("the fleet rule", lambda: self._fleet(cluster), [])
        out += run("the straggler rule", lambda: self._stragglers(eff, out), [])
        out += run("the efficiency rule", lambda: self._efficiency(eff, out), [])
        # The parts' internal errors are added by the pass that ran them (Judgement).
        self.findings = self.book.update(out, now)
        self._last_known = [f for f in self.findings if f.kind not in SOURCE_KINDS]
        return self.findings

    # -- rules -------------------------------------------------------------------------

    def _nodes(self, cluster: ClusterState) -> list[Finding]:
        # A target refused for saying another's name is that finding, not a lost node.
        refused = cluster.names.duplicates
        out = [Finding("critical", "node_lost",
                       f"{n.name} {n.status}: {n.reason or 'no frames'}", node=n.name,
                       score=0.5)
               for n in cluster.nodes.values()
               if n.lost and n.last_seen is not None and n.target not in refused]
        out += cluster.names.findings()
        never = [n for n in cluster.nodes.values()
                 if n.lost and n.last_seen is None and n.target not in refused]
        if never:  # one finding: twenty thousand lines would say less
            # Made again only when a node or its reason changes: folding thousands of
            # names into a host list costs tens of ms, and this runs every pass.
            key = tuple((n.name, n.reason) for n in never)
            if self._unreached is None or self._unreached[0] != key:
                self._unreached = (key, unreached(never))
            out.append(self._unreached[1])
        return out

    def _gpu_init(self, cluster: ClusterState) -> list[Finding]:
        # GPUs on its bus and none usable: the node's own gpu_missing, not this.
        return [Finding("critical", "gpu_init_failed",
                        f"{n.name}: no GPUs seen: {n.hello.gpu_status}", node=n.name, score=0.6)
                for n in gpus_unseen(cluster, self.cpu_nodes)
                if n.hello is not None and n.hello.gpu_status
                and not n.hello.extra.get("pci_gpus")]

    def _node_local(self, cluster: ClusterState, now: float) -> list[Finding]:
        """Each node's own conditions: as its agent judged them (the `findings` family),
        or, for an agent that predates it, judged here by the same rules."""
        out: list[Finding] = []
        live = set()
        read = self._read_conditions
        for n in cluster.nodes.values():
            if n.conditions is not None:
                if n.status == UP and n.conditions:
                    # Read again only when they changed: each sample brings a new list,
                    # but a standing condition's is equal (compared in C).
                    held = read.get(n.target)
                    if held is None or held[1] != n.name or held[0] != n.conditions:
                        held = read[n.target] = (n.conditions, n.name,
                                                 findings_from_wire(n.conditions, n.name))
                    out += held[2]
                continue
            live.add(n.target)
            # One node's values a rule cannot judge (a bug) lose that node's rules only.
            out += self.guard.run(f"the node rules of {n.name}",
                                  partial(self._judge_node, n, now), [])
        for gone in self._rules.keys() - live:
            del self._rules[gone]
            self._judged.pop(gone, None)
        if len(read) > len(cluster.nodes):
            for gone in read.keys() - cluster.nodes.keys():
                del read[gone]
        return out

    def _judge_node(self, n: NodeState, now: float) -> list[Finding]:
        """The node rules, here, for a node whose agent does not judge itself: when a
        sample or hello comes, and else every REJUDGE_S (a window that ends), not every
        second: a Prometheus source at 4096 nodes brings a node's sample every 5 to
        30 s, and judging each node every second took a sixth of a core."""
        rules = self._rules.get(n.target)
        if rules is None or rules.name != n.name:
            rules = self._rules[n.target] = NodeRules(n.name)
            self._judged.pop(n.target, None)
        last = self._judged.get(n.target)
        if (last is not None and last[0] is n.detail and last[1] is n.hello
                and last[2] == n.status and 0.0 <= now - last[3] < REJUDGE_S):
            return last[4]
        if n.detail is not None:
            rules.observe(n.hello, n.detail, now)
        found = rules.conditions(now) if n.status == UP else []
        self._judged[n.target] = (n.detail, n.hello, n.status, now, found)
        return found

    def _congestion(self, cluster: ClusterState,
                    local: list[Finding]) -> list[Finding]:
        """Congestion that takes comparing nodes: a leaf's nodes all waiting, the spine,
        a node whose ports all wait. A port its own node already named (the node rule,
        `local`) is not named again."""
        # Per node, its ports and their xmit_wait (ticks/s), from the overviews: at 4096
        # nodes that is ~33k ports a second, so whole lists, not a tuple per port.
        nodes: list[tuple[str, list[str], list[float]]] = []
        every: list[float] = []
        for n in cluster.nodes.values():
            ov = n.overview
            if ov is None or n.status != UP:
                continue
            read = port_waits(ov, n.port_ids)
            if read is None:
                continue
            ports, waits = read
            nodes.append((n.name, ports, waits))
            every.extend(waits)
        if not every:
            return []
        out = self._leaves(nodes)
        if any(f.leaf == "spine" for f in out):
            return out
        # Ports and nodes that stand out from all their peers: seen with or without a
        # topology (with one, the finding names the leaf too). With no port above the
        # floor none can, and the median (a sort of every port) is not needed.
        if max(every) < CONGESTED_WAIT:
            return out
        median = _median(every)
        threshold = max(CONGESTED_WAIT, OUTLIER_FACTOR * max(median, 1.0))
        hot: dict[str, list[tuple[str, float]]] = {}
        for node, ports, waits in nodes:
            if max(waits) >= threshold:
                hot[node] = [(p, w) for p, w in zip(ports, waits) if w >= threshold]
        flagged_leaves = {f.leaf for f in out}
        named = {(f.node, f.port) for f in local}
        for node, items in sorted(hot.items()):
            leaf = self.topology.get(node)
            if leaf is not None and leaf in flagged_leaves:
                continue  # the leaf's finding already names it
            items = [(p, w) for p, w in items if (node, p) not in named]
            if not items:
                continue  # the node named its own ports
            items.sort(key=lambda x: -x[1])
            names = ", ".join(p for p, _ in items)
            worst = items[0][1]
            under = f" (under {leaf})" if leaf else ""
            out.append(Finding(
                "warning", "congestion",
                f"{node}{under}: congestion on {names}: xmit_wait {worst:,.0f}/s vs "
                f"{median:,.0f}/s median of {len(every)} ports",
                node=node, port=items[0][0] if len(items) == 1 else None, leaf=leaf,
                score=0.9))
        return out

    def _leaves(self, nodes: list[tuple[str, list[str], list[float]]]) -> list[Finding]:
        """With a topology: a leaf whose nodes all wait, or every leaf (the spine)."""
        if not self.topology:
            return []
        per_leaf: dict[str, list[float]] = {}
        members: dict[str, list[str]] = {}
        for node, _, waits in nodes:
            leaf = self.topology.get(node)
            if leaf is None:
                continue
            per_leaf.setdefault(leaf, []).append(_median(waits))
            members.setdefault(leaf, []).append(node)
        if not per_leaf:
            return []
        medians = {leaf: _median(v) for leaf, v in per_leaf.items()}
        hot = {leaf: m for leaf, m in medians.items() if m >= CONGESTED_WAIT}
        if not hot:
            return []
        if len(medians) > 1 and len(hot) == len(medians):
            return [Finding("warning", "congestion", "congestion under every leaf: look at "
                            "the spine or the job's traffic pattern", leaf="spine", score=0.9)]
        out = []
        for leaf, m in sorted(hot.items(), key=lambda x: -x[1]):
            others = [v for k, v in medians.items() if k != leaf]
            base = _median(others) if others else 0.0
            if not others or m >= OUTLIER_FACTOR * max(base, 1.0):
                # The leaf's nodes as a host list one can paste (scontrol, pdsh, the filter).
                # With no other leaf reporting there is no elsewhere to compare it with.
                against = f" vs {base:,.0f}/s elsewhere" if others else \
                    " (the only leaf in the topology)" if len(set(self.topology.values())) \
                    == 1 else " (no other leaf reporting)"
                out.append(Finding("warning", "congestion",
                                   f"congestion concentrated under {leaf}: xmit_wait "
                                   f"{m:,.0f}/s{against} "
                                   f"({collect_hostlist(members[leaf])})",
                                   leaf=leaf, nodes=tuple(sorted(members[leaf])), score=1.0))
        return out

    def _storage(self, storage: StorageView) -> list[Finding]:
        out = []
        for mount, fs in storage.filesystems.items():
            prov = storage.provisioned.get(mount)
            if prov is not None and near_provisioned(fs.read + fs.write, prov):
                out.append(Finding("warning", "storage",
                                   f"{mount} at {100 * (fs.read + fs.write) / prov:.0f}% of "
                                   "its provisioned throughput", fs=mount, score=0.7))
        return out

    def _fleet(self, cluster: ClusterState) -> list[Finding]:
        """The nodes that differ from most of the fleet (tuimon_core.fleet), judged again
        only when a hello changed."""
        version = cluster.hellos_version
        if self._fleet_seen[0] != version:
            hellos = hellos_of(((n.name, n.hello) for n in cluster.nodes.values()),
                                self.cpu_nodes)
            self._fleet_seen = (version, fleet_findings(hellos))
        return self._fleet_seen[1]

    def _stragglers(self, eff: EfficiencyView, signals: list[Finding]) -> list[Finding]:
        """A rank slower than its peers, with what its node shows at the same time (a
        downtrained link, fewer NVLinks, throttling, a port below rate): the likely
        cause, next to the symptom."""
        out = []
        by_node: dict[str, list[Finding]] = {}
        for f in signals:
            if f.kind in STRAGGLER_CAUSES:
                for name in (f.node, *f.nodes):
                    if name:
                        by_node.setdefault(name, []).append(f)
        for job in eff.jobs.values():
            for s in job.stragglers:
                where = f"{s.node} GPU {s.gpu}" if s.gpu is not None else s.node
                causes = [c for c in by_node.get(s.node, ())
                          if c.gpu is None or s.gpu is None or c.gpu == s.gpu]
                causes.sort(key=lambda c: -c.score)
                likely = "; likely: " + "; ".join(_cause(c) for c in causes[:3]) \
                    if causes else ""
                out.append(Finding("warning", "straggler",
                                   f"{where} (rank {s.rank} of {job.job}) computes "
                                   f"x{s.ratio:.2f} the median of its peers{likely}",
                                   node=s.node, gpu=s.gpu, job=job.job, score=0.7))
        return out

    def _efficiency(self, eff: EfficiencyView, signals: list[Finding]) -> list[Finding]:
        out = []
        now = eff.now
        for job in eff.jobs.values():
            burn = job.burn
            firing = burn.firing(now) if burn is not None else []
            if burn is not None and firing:  # the most urgent condition is enough
                severity = firing[0][0]
                out.append(Finding("critical" if severity == "page" else "warning",
                                   f"burn_{severity}",
                                   f"{job.job} burns its error budget: burn "
                                   f"{burn.text(now)}",
                                   job=job.job))
            judged, drop = job.reported_drop(now)
            if not judged:
                judge = self._drops.get(job.job)
                if judge is None:
                    judge = self._drops[job.job] = DropJudge()
                drop = judge.update(*job.drop_windows(now), now)
            short = job.short_sli(now)
            if drop is None or short is None:
                continue  # no drop; or no step reports now: the strip says so
            # Cause first: a line cut at 80 columns keeps the answer.
            causes = likely(job.wait_shares(WINDOWS["1m"], now)[1], signals, job.job,
                            job.nodes())
            # Its onset is the finding's (held from the drop's start), said by each reader
            # as every finding's is: not in the words too.
            said = f"{job.job} SLI {short:.2f}, down from {drop.from_sli:.2f}"
            if causes:
                said = f"likely {causes[0]} -> {said}" + (
                    f"; else {' > '.join(causes[1:])}" if causes[1:] else "")
            # Held since the drop began (the nodes' verdict, or this judge's), so its
            # onset is the drop's, not when this reader first looked.
            out.append(Finding("critical", "efficiency_drop", said, job=job.job,
                               held_s=max(0.0, now - drop.since)))
        for gone in self._drops.keys() - eff.jobs.keys():
            del self._drops[gone]
        return out

