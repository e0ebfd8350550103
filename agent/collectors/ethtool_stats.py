"""Driver statistics of a network interface, read the way `ethtool -S` reads them, and a
summary of RoCE lossless-Ethernet health from the mlx5 counters among them.

What it reads: the SIOCETHTOOL ioctl on an ordinary AF_INET datagram socket, with three
commands per read: ETHTOOL_GSSET_INFO (how many statistics, ETH_SS_STATS), ETHTOOL_GSTRINGS
(their names, 32 bytes each) and ETHTOOL_GSTATS (their values, u64 each). The kernel lets
any user issue these three (net/ethtool/ioctl.c lists them among the commands that need
no CAP_NET_ADMIN), so the agent needs no root and never shells out to `ethtool`.

Why: on a RoCE fabric the counters that say whether lossless Ethernet is working -- PFC
pause frames and how long the port was paused, pause-storm watchdog events, buffer
discards -- are neither in /sys/class/net/*/statistics nor among the RDMA hw_counters; mlx5
publishes them only as ethtool statistics. `pause_summary` folds them into a few totals
that a caller turns into rates, and says which priorities have PFC on (which drops were
lossless traffic) and which kind of pause the port sends.

If GSSET_INFO itself fails (only kernels from the 2000s lack it) the error is reported;
there is no fallback to the ETHTOOL_GDRVINFO n_stats field.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import re
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

SIOCETHTOOL = 0x8946
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16

# struct ifreq is 40 bytes on LP64 (16-byte name, 24-byte union whose ifr_data is the
# pointer). Padding to 40 everywhere is safe: a 32-bit kernel reads only its 32.
_IFREQ = struct.Struct("@16sP")  # native: P (a pointer) exists only there
_IFREQ_SIZE = 40
# '=' because these are the kernel's native-endian structs with no padding before data[].
_SSET_INFO = struct.Struct("=IIQI")  # cmd, reserved, sset_mask, data[0]
_GSTRINGS_HDR = struct.Struct("=III")  # cmd, string_set, len; names follow at 12
_GSTATS_HDR = struct.Struct("=II")  # cmd, n_stats; u64 values follow at 8

# GSTRINGS and GSTATS write as many entries as the driver has *now*, whatever length was
# asked for; a count that grows between our calls would write past a buffer sized exactly.
# The headroom makes that need a jump of more than double within microseconds.
_HEADROOM_MIN = 256
# A driver whose counter set changes under every read (channels being reconfigured) gets
# a few tries, then an EAGAIN error rather than a mislabelled sample.
_ATTEMPTS = 3

_BAD_NAME = re.compile(rb"[/:\s\x00]")

_REASONS = {
    errno.EOPNOTSUPP: "EOPNOTSUPP: the driver has no statistics",
    errno.ENODEV: "ENODEV: no such interface",
    errno.EPERM: "EPERM: permission denied for SIOCETHTOOL (a seccomp or LSM policy?)",
    errno.EACCES: "EACCES: permission denied for SIOCETHTOOL (a seccomp or LSM policy?)",
    errno.EINVAL: "EINVAL: invalid interface name",
    errno.EAGAIN: "EAGAIN: the driver's counter set kept changing while it was read",
}


def _reason(err: int) -> str:
    if err in _REASONS:
        return _REASONS[err]
    return f"{errno.errorcode.get(err, f'errno {err}')}: {os.strerror(err)}"


class EthtoolError(OSError):
    """Statistics of `ifname` could not be read; `errno` says why, the message names the
    interface and the reason (EOPNOTSUPP, ENODEV, EPERM, EINVAL for a refused name...)."""

    def __init__(self, ifname: str, err: int, reason: str | None = None) -> None:
        # A refused name may hold anything (newlines, slashes); quote it in the message.
        shown = ifname if ifname.isprintable() and " " not in ifname and ifname else repr(ifname)
        super().__init__(err, f"{shown}: {reason or _reason(err)}")
        self.ifname = ifname


def _encode_name(ifname: str) -> bytes:
    """The name as the kernel wants it, or EthtoolError(EINVAL) before any ioctl.

    Mirrors the kernel's dev_valid_name and refuses ':' too: SIOCETHTOOL cuts the name at
    a colon, so `eth0:1` would silently read eth0.
    """
    try:
        raw = os.fsencode(ifname)
    except UnicodeEncodeError:
        raw = b"/"  # unencodable: refused below like any other bad name
    if not raw or len(raw) >= IFNAMSIZ or raw in (b".", b"..") or _BAD_NAME.search(raw):
        raise EthtoolError(
            ifname, errno.EINVAL,
            "EINVAL: not an interface name (1-15 bytes, no '/', ':', whitespace or NUL)",
        )
    return raw


def _decode_names(raw: bytes, count: int) -> tuple[str, ...]:
    # Old mlx5 kernels declare "tx_pause_storm_warning_events " with a trailing space.
    return tuple(
        raw[i * ETH_GSTRING_LEN:(i + 1) * ETH_GSTRING_LEN]
        .split(b"\0", 1)[0].decode("utf-8", "replace").strip()
        for i in range(count)
    )


class EthtoolStats:
    """Reads `ethtool -S` statistics with one lazily opened socket; `close()` releases it.

    Counter names are cached per interface. The raw name table is still fetched on every
    read and compared with the cached one, because the count alone cannot tell a change:
    mlx5 lists pause counters for global pause *or* for each PFC priority, so moving a port
    from global pause to PFC on one priority keeps the count and changes the names.
    Not thread-safe: one instance per collector thread.
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._names: dict[bytes, tuple[bytes, tuple[str, ...]]] = {}

    def __enter__(self) -> EthtoolStats:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._names.clear()

    def read(self, ifname: str) -> dict[str, int]:
        """Counter name -> value for `ifname`, in the driver's order; names are stripped,
        and a name the driver repeats keeps its last value. Raises EthtoolError."""
        raw_name = _encode_name(ifname)
        for _ in range(_ATTEMPTS):
            count = self._count(ifname, raw_name)
            if count == 0:
                return {}
            names = self._read_names(ifname, raw_name, count)
            if names is None:
                continue
            values = self._read_values(ifname, raw_name, len(names))
            if values is None:
                continue
            return dict(zip(names, values))
        raise EthtoolError(ifname, errno.EAGAIN)

    def _count(self, ifname: str, raw_name: bytes) -> int:
        buf = array.array("B", bytes(_SSET_INFO.size))
        _SSET_INFO.pack_into(buf, 0, ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0)
        self._ioctl(ifname, raw_name, buf)
        _, _, mask, count = _SSET_INFO.unpack_from(buf)
        # The kernel clears the bit when the driver has no get_sset_count (lo, most
        # virtual devices) instead of failing the ioctl.
        if not mask & (1 << ETH_SS_STATS):
            raise EthtoolError(ifname, errno.EOPNOTSUPP)
        return int(count)

    def _read_names(self, ifname: str, raw_name: bytes, count: int) -> tuple[str, ...] | None:
        room = count + max(count, _HEADROOM_MIN)
        buf = array.array("B", bytes(_GSTRINGS_HDR.size + room * ETH_GSTRING_LEN))
        _GSTRINGS_HDR.pack_into(buf, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        self._ioctl(ifname, raw_name, buf)
        n = _GSTRINGS_HDR.unpack_from(buf)[2]
        if n != count:
            return None
        raw = buf[_GSTRINGS_HDR.size:_GSTRINGS_HDR.size + n * ETH_GSTRING_LEN].tobytes()
        cached = self._names.get(raw_name)
        if cached is not None and cached[0] == raw:
            return cached[1]
        names = _decode_names(raw, n)
        self._names[raw_name] = (raw, names)
        return names

    def _read_values(self, ifname: str, raw_name: bytes, count: int) -> list[int] | None:
        room = count + max(count, _HEADROOM_MIN)
        # 'Q' items are the kernel's u64s; item 0 carries the two u32 header fields.
        buf = array.array("Q", bytes(8 * (1 + room)))
        _GSTATS_HDR.pack_into(buf, 0, ETHTOOL_GSTATS, count)
        self._ioctl(ifname, raw_name, buf)
        n = _GSTATS_HDR.unpack_from(buf)[1]
        if n != count:
            return None
        return buf[1:1 + n].tolist()

    def _ioctl(self, ifname: str, raw_name: bytes, buf: array.array[int]) -> None:
        """SIOCETHTOOL on `raw_name` with ifr_data pointing at `buf`, which the kernel
        reads the command from and writes the answer into."""
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            ifreq = _IFREQ.pack(raw_name, buf.buffer_info()[0]).ljust(_IFREQ_SIZE, b"\0")
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq)
        except OSError as e:
            err = e.errno if e.errno is not None else errno.EIO
            raise EthtoolError(ifname, err) from e


# pause_summary's patterns for the mlx5 counter names it reads (names stripped first).
_PAUSE_RE = re.compile(r"(rx|tx)_(global|prio([0-7]))_pause(_duration)?")
_PRIO_TRAFFIC_RE = re.compile(r"rx_prio([0-7])_(discards|packets)")
_SINGLE = {
    "tx_pause_storm_warning_events": "storm_warning",
    "tx_pause_storm_error_events": "storm_error",
    "rx_discards_phy": "discards_phy",
    "rx_packets_phy": "packets_phy",
}
# Where `discards` came from (PauseSummary.drops_from).
PRIO_DISCARDS = "rx_prio<N>_discards"
PHY_DISCARDS = "rx_discards_phy"
# The drop counters of PauseSummary.totals, which a caller turns into rates.
DROP_TOTALS = ("discards", "arrived", "lossless_discards", "lossless_arrived")


@dataclass(frozen=True, slots=True)
class PauseSummary:
    """A RoCE port's lossless-Ethernet counters, from its mlx5 ethtool statistics.

    ``totals`` holds cumulative counters (a key only where one of its counters is
    listed: absent is not zero):

    - ``pause_rx`` / ``pause_tx``: pause frames received / sent, ``rx_global_pause`` +
      ``rx_prio<N>_pause`` for every N (``tx_`` likewise): separate frames, never the same
      one counted twice.
    - ``pause_rx_us`` / ``pause_tx_us``: microseconds paused, the ``*_pause_duration``
      counters summed likewise. Rx is time the peer held this port off; tx is time this
      port held the peer off. ``pause_tx_us_pfc`` and ``pause_tx_us_global`` are the tx
      part of each kind of pause, so a caller can say which one moved.
    - ``storm_warning`` / ``storm_error``: ``tx_pause_storm_warning_events`` /
      ``tx_pause_storm_error_events``, the stall watchdog's minor and critical watermark
      crossings (the error one means the NIC stopped sending pause to break a storm).
    - ``discards``: packets dropped for lack of receive buffer on the port, each drop
      counted once: the per-priority ``rx_prio<N>_discards`` summed where the driver lists
      them (they say which priority dropped), else ``rx_discards_phy``. Never both: they
      count the same drops (kernel commit 827a8cb2dd2b, "Add discard counters per
      priority", says so of its counters; a real ConnectX under an XDP flood read
      ``rx_discards_phy`` 441063206498 and ``rx_prio0_discards`` 441063206498), and
      adding them doubled the rate.
    - ``arrived``: packets that reached the port, kept or dropped, from the same family
      as ``discards`` (``rx_prio<N>_packets`` + ``rx_prio<N>_discards``, else
      ``rx_packets_phy``, which counts the dropped ones too: 287214264688 +
      441063206498 = 728277471186 in the same capture): what a share of drops is of.
    - ``lossless_discards`` / ``lossless_arrived``: the same, on the priorities with PFC
      on only (below); present only where both are known.

    ``pfc`` is the priorities with PFC on: mlx5 lists a priority's ``*_prio<N>_pause*``
    counters exactly when PFC is on for it (rx or tx), and the ``*_global_pause*`` ones
    exactly when global pause is on (``global_pause``). A drop on a PFC priority is a
    lossless packet lost; any other drop is ordinary lossy traffic.

    ``rx_prio<N>_buf_discard`` and ``rx_prio<N>_cong_discard`` (per traffic class:
    shared-buffer and WRED drops) are left out: other views of drops the port counters
    may already hold. So are ``*_pause_transition`` and the 802.3 ``*_pause_ctrl_phy``
    counters (the latter repeat the pause counts).
    """

    totals: dict[str, int]
    pfc: tuple[int, ...] = ()
    global_pause: bool = False
    drops_from: str | None = None  # PRIO_DISCARDS, PHY_DISCARDS, or None: no drop counter


def pause_summary(stats: Mapping[str, int]) -> PauseSummary:
    """Lossless-Ethernet totals from mlx5 ethtool statistics (PauseSummary says which).

    Sources of the names: Linux drivers/net/ethernet/mellanox/mlx5/core/en_stats.c --
    ``pport_per_prio_pfc_stats_desc`` ("rx_%s_pause", "rx_%s_pause_duration",
    "tx_%s_pause", "tx_%s_pause_duration", "rx_%s_pause_transition", %s being "global" or
    "prio<i>", listed by ``mlx5e_grp_per_prio_pfc_fill_strings`` for each priority set in
    the port's PFC configuration and for global pause when it is on),
    ``pport_pfc_stall_stats_desc`` (tx_pause_storm_warning_events,
    tx_pause_storm_error_events), ``pport_2863_stats_desc`` (rx_discards_phy),
    ``pport_802_3_stats_desc`` (rx_packets_phy) and ``pport_per_prio_traffic_stats_desc``
    (rx_prio%d_packets, rx_prio%d_discards, listed for all eight priorities); their meaning
    and the microsecond unit of the durations: Documentation/networking/device_drivers/
    ethernet/mellanox/mlx5/counters.rst.
    """
    out: dict[str, int] = {}
    pfc: set[int] = set()
    global_pause = False
    prio: dict[str, dict[int, int]] = {"discards": {}, "packets": {}}

    def add(key: str, value: int) -> None:
        out[key] = out.get(key, 0) + value

    # Names stripped first (old mlx5 kernels pad one); a name listed twice keeps its last.
    for name, value in {k.strip(): v for k, v in stats.items()}.items():
        if m := _PAUSE_RE.fullmatch(name):
            direction, _, priority, duration = m.groups()
            add(f"pause_{direction}{'_us' if duration else ''}", value)
            if priority is not None:
                pfc.add(int(priority))
            else:
                global_pause = True
            if direction == "tx" and duration:
                add(f"pause_tx_us_{'pfc' if priority is not None else 'global'}", value)
        elif m := _PRIO_TRAFFIC_RE.fullmatch(name):
            prio[m[2]][int(m[1])] = value
        elif name in _SINGLE:
            add(_SINGLE[name], value)
    drops_from = None
    discards, packets = prio["discards"], prio["packets"]
    if discards:
        drops_from = PRIO_DISCARDS
        out["discards"] = sum(discards.values())
        if packets:
            out["arrived"] = sum(packets.values()) + out["discards"]
        if pfc and packets:
            out["lossless_discards"] = sum(discards.get(p, 0) for p in pfc)
            out["lossless_arrived"] = sum(packets.get(p, 0) + discards.get(p, 0) for p in pfc)
    elif "discards_phy" in out:
        drops_from = PHY_DISCARDS
        out["discards"] = out["discards_phy"]
        if "packets_phy" in out:
            out["arrived"] = out["packets_phy"]
    out.pop("discards_phy", None)
    out.pop("packets_phy", None)
    return PauseSummary(out, tuple(sorted(pfc)), global_pause, drops_from)
