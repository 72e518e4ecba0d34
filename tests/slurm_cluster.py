"""A one-node Slurm cluster for the tests: Debian's ``slurm-wlm`` and ``munge`` daemons started in a
temporary directory on loopback, without systemd.

:func:`start` writes a munge key and a ``slurm.conf`` (one node with this machine's CPUs, one
partition, no accounting database, no cgroups, free ports; the daemons listen on loopback only
where this machine's name resolves to it, as on CI), starts ``munged``, ``slurmctld`` and
``slurmd`` and waits until the node is idle; the client commands (``sbatch``, ``squeue``,
``scontrol``, and submitit, which calls them) find the cluster through ``SLURM_CONF``.
:func:`unavailable` says why a cluster cannot start here (not installed, not root: ``slurmd``
starts tasks as their users), and the tests skip with that reason unless
``SHARPSCAPE_REQUIRE_SLURM=1`` (set by ``.ci/run``, which installs the packages) makes it a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")


def _sbin(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.is_file()), None
    )


def unavailable() -> str | None:
    """Why a one-node cluster cannot start on this machine, or ``None``."""
    missing = [n for n in DAEMONS + CLIENTS if _sbin(n) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start tasks (these tests run as another user)"
    return None


#: the daemons bind to the address this machine's name resolves to instead of all interfaces
LOOPBACK_ONLY = ["CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"]


def _resolves_to_loopback(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address (then :data:`LOOPBACK_ONLY` keeps the
    daemons on it; where it resolves to another interface they keep listening on all of them, as
    the clients reach them through 127.0.0.1)."""
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running one-node cluster: its directory, ``slurm.conf`` and the environment to use it."""

    root: Path
    conf: Path
    pids: dict[str, int]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def listening(self) -> dict[str, str]:
        """``{daemon: IPv4 address}`` of the sockets the daemons listen on (``/proc/net/tcp``)."""
        conf = dict(line.split("=", 1) for line in self.conf.read_text().splitlines() if "=" in line)
        ports = {int(conf["SlurmctldPort"]): "slurmctld", int(conf["SlurmdPort"]): "slurmd"}
        out = {}
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, port = local.split(":")
            if state == "0A" and int(port, 16) in ports:  # 0A: LISTEN
                out[ports[int(port, 16)]] = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
        return out

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
            for f in sorted(self.root.glob("*.log"))
        )

    def stop(self) -> None:
        """Cancel every job (and wait for its processes), then stop the daemons."""
        jobs = self.command("squeue", "--noheader", "--format=%A", check=False).split()
        if jobs:
            self.command("scancel", "--full", *jobs, check=False)
            end = time.monotonic() + 30
            while time.monotonic() < end and self.command("squeue", "--noheader", check=False).strip():
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            pid = self.pids.get(name)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            end = time.monotonic() + 10
            while time.monotonic() < end and _alive(pid):
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of a daemon this process started is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _read_pid(path: Path, timeout: float = 20.0) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    raise RuntimeError(f"{path} was not written")


def start(root: Path, cpus: int | None = None) -> Cluster:
    """Start munged, slurmctld and slurmd under ``root``; returns the :class:`Cluster` (raises
    ``RuntimeError`` with the daemons' last log lines if the node does not come up)."""
    root.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool"):
        (root / d).mkdir(exist_ok=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    pids: dict[str, int] = {}
    subprocess.run(
        [_sbin("munged"), "--force", f"--socket={root / 'munge.socket'}", f"--key-file={key}",
         f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munged.pid'}",
         f"--seed-file={root / 'munged.seed'}"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    pids["munged"] = _read_pid(root / "munged.pid")
    host = socket.gethostname().split(".")[0]
    cpus = cpus or os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=sharpscape-test",
                f"SlurmctldHost={host}(127.0.0.1)",
                "SlurmUser=root",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "AuthType=auth/munge",
                f"AuthInfo=socket={root / 'munge.socket'}",
                "CredType=cred/munge",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "SchedulerType=sched/backfill",
                "SchedulerParameters=sched_interval=1",
                "ReturnToService=2",
                "MpiDefault=none",
                "JobCompType=jobcomp/none",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                "SwitchType=switch/none",
                *(LOOPBACK_ONLY if _resolves_to_loopback(host) else []),
                "KillWait=10",
                "MinJobAge=600",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
                "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root, conf, pids)
    try:
        subprocess.run(
            [_sbin("slurmctld"), "-f", str(conf)], env=env, check=True, capture_output=True, timeout=30
        )
        pids["slurmctld"] = _read_pid(root / "slurmctld.pid")
        subprocess.run(
            [_sbin("slurmd"), "-f", str(conf), "-N", host],
            env=env,
            check=True,
            capture_output=True,
            timeout=30,
        )
        pids["slurmd"] = _read_pid(root / "slurmd.pid")
        end = time.monotonic() + 60
        while time.monotonic() < end:
            state = cluster.command("sinfo", "--noheader", "--format=%t", check=False).strip()
            if state == "idle":
                return cluster
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle (sinfo: {state!r})")
    except (subprocess.SubprocessError, RuntimeError) as exc:
        tail = cluster.log_tail()
        cluster.stop()
        raise RuntimeError(f"the one-node Slurm cluster did not start: {exc}\n{tail}") from None


def wait_until(test, timeout: float, what: str, cluster: Cluster | None = None, every: float = 0.5):
    """Poll ``test()`` until it returns a true value (returned) or ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = test()
        if value:
            return value
        time.sleep(every)
    extra = f"\nqueue:\n{cluster.command('squeue', check=False)}\n{cluster.log_tail()}" if cluster else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
