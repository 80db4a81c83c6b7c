"""One job's process: started with ``/bin/sh -c`` in its own session, stopped as a whole group.

Why a session of its own: a job is a tree (a shell, a launcher, data-loader workers, ...). The
stop signal goes to the process group, so nothing of the job is left running on a GPU after a
stop, and a Ctrl-C at the worker's terminal does not reach the jobs (the worker decides).

Output (stdout and stderr merged) is drained into a bounded tail, so a job that writes a lot never
blocks on a full pipe and the worker never holds more than ``tail_bytes``; every chunk also goes to
``on_output`` (the log shipper's bounded buffer, which never blocks either). One thread drains every
job's pipe (``OutputPump``, on ``epoll`` where there is one): what it does with a chunk is two
appends under short locks, so it keeps up with many jobs, and a worker running hundreds of short
jobs a second does not start (and switch between) a reader thread per job.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import psutil

from corral.worker.cgroups import AttemptGroup
from corral.worker.identity import Account
from corral.worker.output import OutputPump, OutputTail, shared_pump  # noqa: F401 - OutputPump re-exported

logger = logging.getLogger("corral.worker.executor")

#: What became of a hint (``JobProcess.hint``).
Hint = Literal["sent", "unhandled", "gone"]

#: a job with a cgroup starts as this shell, which waits for one line on its stdin (a pipe) while
#: the worker puts it in the cgroup, gives the job /dev/null as stdin, then runs the command in
#: itself (``$1``) as ``sh -c`` would have
START_GATE = (
    'read -r _; exec </dev/null; __corral_command=$1; shift; eval "unset __corral_command; $__corral_command"'
)

_POLL_S = 0.05
# After SIGKILL a process normally dies at once; one stuck in uninterruptible sleep (a wedged
# driver call) does not, and the worker must not hang on it forever.
KILL_WAIT_S = 10.0
# A group that answers signal 0 after its leader exited is scanned for live (non-zombie) members
# at most this often while a stop waits for it.
_SCAN_EVERY_S = 0.5
# After the pidfd said the job exited, how soon to try reaping it again when another thread has
# Popen's reaping lock.
_REAP_RETRY_S = 0.005
# How long the output reader may take to reach the end of the pipe once the job is gone.
_READER_JOIN_S = 2.0


def _open_pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when ``pid`` exits (Linux >= 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def live_group_members(group_id: int) -> list[int]:
    """Processes of the group that are not zombies, from ``/proc`` (Linux); elsewhere, the group
    leader alone when it still answers signal 0.

    Only called when ``killpg(group, 0)`` says the group still exists, which is rare: a full scan of
    ``/proc`` is a few milliseconds.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(group_id, 0)
        except OSError:
            return []
        return [group_id]
    return [int(entry) for entry in entries if entry.isdigit() and is_live_member(int(entry), group_id)]


def is_live_member(pid: int, group_id: int) -> bool:
    """``pid`` is a process of the group that is not a zombie, from ``/proc/PID/stat`` (False where
    it cannot be read: the process is gone, or this is not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    # fields[0] is the state (Z zombie, X dead), fields[2] the process group
    return len(fields) > 2 and int(fields[2]) == group_id and fields[0] not in (b"Z", b"X")


def handles_signal(
    pid: int, signal_number: int, masks: tuple[bytes, ...] = (b"SigCgt", b"SigIgn", b"SigBlk")
) -> bool | None:
    """Whether ``pid`` catches, ignores or blocks ``signal_number`` (so that it does not die of
    it), from ``/proc/PID/status``; None where that cannot be read (gone, or not Linux).
    ``masks``: which of the three count (``(b"SigCgt",)``: only a handler)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            lines = status.read().splitlines()
    except OSError:
        return None
    bits = 0
    for line in lines:
        name, _, value = line.partition(b":")
        if name in masks:
            bits |= int(value.strip() or b"0", 16)
    return bool(bits & (1 << (signal_number - 1)))


def signal_handlers(root_pid: int, signal_number: int) -> list[psutil.Process]:
    """The processes of the tree under ``root_pid`` (itself included) that catch ``signal_number``
    (``SigCgt``), whatever wraps them: ``sh -c "python train.py"`` under a shell that does not exec
    its last command, ``bash -c "cd x && python y"``, a launcher and its workers."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    return [process for process in tree if handles_signal(process.pid, signal_number, (b"SigCgt",))]


#: the job's output pipe is widened to this (Linux's default is 64 KiB): at 50 MB/s a 64 KiB pipe
#: is full in 1.3 ms, less than one GIL switch interval (5 ms) of the worker's other threads
PIPE_BYTES = 1024 * 1024


def _widen_pipe(descriptor: int) -> None:
    """Best effort: a larger pipe lets the job write on while the reader waits for the GIL or a
    CPU (``bench/log_throughput.py``); capped by ``/proc/sys/fs/pipe-max-size``, Linux only."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Python < 3.10 lacks the name
    try:
        fcntl.fcntl(descriptor, set_size, PIPE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            fcntl.fcntl(descriptor, set_size, 256 * 1024)


_devnull_fd: int | None = None
_devnull_lock = threading.Lock()


def _devnull() -> int:
    """One read-only ``/dev/null`` descriptor for every job's stdin, opened once (``Popen``'s own
    ``DEVNULL`` opens and closes one per job); close-on-exec, so only the job's stdin gets it."""
    global _devnull_fd
    with _devnull_lock:
        if _devnull_fd is None:
            _devnull_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return _devnull_fd


def exit_code_of(returncode: int) -> int:
    """The shell convention: a death by signal N is 128 + N (Popen reports it as -N)."""
    return 128 - returncode if returncode < 0 else returncode


class JobProcess:
    """A started job. ``stop()`` runs its sequence once, however many threads ask for it."""

    def __init__(
        self,
        command: str,
        env: Mapping[str, str],
        tail_bytes: int,
        grace_s: float,
        log_fields: Mapping[str, Any] | None = None,
        kill_wait_s: float | None = None,
        on_output: Callable[[bytes], None] | None = None,
        cwd: str | None = None,
        account: Account | None = None,
        cgroup: AttemptGroup | None = None,
    ) -> None:
        self.command = command
        #: also given every chunk of output as it is read (the log shipper); must not block
        self._on_output = on_output
        self.grace_s = grace_s
        self.kill_wait_s = KILL_WAIT_S if kill_wait_s is None else kill_wait_s
        self.tail = OutputTail(tail_bytes)
        self._stop_lock = threading.Lock()
        self._stopping = False
        self._stop_done = threading.Event()
        self._stopped_running = False
        self._survived_kill = False
        self._last_scan = -_SCAN_EVERY_S
        self._gone = False
        self._members: list[int] = []
        # The job's descendants when the stop began, wherever their process group (a GNU
        # ``timeout`` or a ``bash -m`` moves its children to a group of their own).
        self._descendants: list[psutil.Process] = []
        # As another account: its uid, its groups, its umask, taken in the child before the exec.
        as_account: dict[str, Any] = {}
        if account is not None and account.uid != os.getuid():
            as_account = {
                "user": account.uid,
                "group": account.gid,
                "extra_groups": list(account.groups),
                "umask": account.umask,
            }
        #: the attempt's cgroup: every process of the job, however it detached (None: none on this host)
        self.cgroup = cgroup
        gate_read, gate_write = os.pipe() if cgroup is not None else (None, None)
        arguments = (
            ["/bin/sh", "-c", command] if cgroup is None else ["/bin/sh", "-c", START_GATE, "sh", command]
        )
        # Running the user's command in a shell is the worker's purpose (the job's submitter chose it).
        # The output pipe is made here, not by Popen (``stdout=PIPE``), whose file object around
        # its end cost three more system calls per job, each a hand-over of the interpreter's lock
        # between the worker's threads; the pump reads the bare descriptor anyway.
        output_read, output_write = os.pipe()
        try:
            self._popen = subprocess.Popen(  # noqa: S603
                arguments,
                env=env,
                stdin=_devnull() if gate_read is None else gate_read,
                stdout=output_write,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                cwd=cwd,
                **as_account,
            )
        except BaseException:
            for descriptor in (output_read, gate_read, gate_write):
                if descriptor is not None:
                    os.close(descriptor)
            raise
        finally:
            os.close(output_write)
        self._output_read = output_read
        self.pid = self._popen.pid
        self._pidfd: int | None = None
        try:
            if gate_read is not None and gate_write is not None:
                os.close(gate_read)
                self._join_cgroup(gate_write)
            _widen_pipe(output_read)
            self._pidfd = _open_pidfd(self.pid)
            # Every line about the job carries its ids (job_id, worker_id, attempt) and the pid.
            self.fields = {**(log_fields or {}), "pid": self.pid}
            self._output_ended = threading.Event()
            shared_pump().add(output_read, self._take_output, self._end_output)
        except BaseException:
            # Not handed to the pump: nothing else closes the bare descriptor (no file object's
            # finalizer, as with ``stdout=PIPE``). Nor does anything supervise the job, which the
            # caller reports as not started: it must not run on. Its group is signalled while its
            # leader is unreaped (its pid, the group's id, cannot belong to anyone else yet).
            os.close(output_read)
            self.close()
            if self._popen.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
                self._popen.wait()
            raise

    def _join_cgroup(self, gate: int) -> None:
        """Put the waiting shell in the attempt's cgroup, then let it run the command; a job that
        cannot join is killed before it ran anything (the error goes to the caller)."""
        assert self.cgroup is not None
        try:
            self.cgroup.attach(self.pid)
        except OSError:
            os.close(gate)
            self._popen.kill()
            self._popen.wait()
            raise
        try:
            os.write(gate, b"\n")
        finally:
            os.close(gate)

    # --- output ----------------------------------------------------------------------------

    def _end_output(self) -> None:
        """From the pump's thread: the pipe reached its end (every writer is gone)."""
        os.close(self._output_read)
        self._output_ended.set()

    def _take_output(self, chunk: bytes) -> None:
        """From the pump's thread: one chunk of the job's output."""
        self.tail.append(chunk)
        if self._on_output is not None:
            self._hand_on(chunk)

    def _hand_on(self, chunk: bytes) -> None:
        """Give a chunk to ``on_output``; one that raises is dropped for good (the pipe must drain)."""
        assert self._on_output is not None
        try:
            self._on_output(chunk)
        except Exception:
            logger.exception("output listener failed; output is no longer handed on", extra=self.fields)
            self._on_output = None

    # --- state -----------------------------------------------------------------------------

    def poll(self) -> int | None:
        """The exit code (128 + N for signal N) once the job's main process has exited, else None."""
        returncode = self._popen.poll()
        return None if returncode is None else exit_code_of(returncode)

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the main process; its exit code, or None if still running.

        Why a pidfd: ``Popen.wait(timeout)`` polls ``waitpid`` every 50 ms, which for a worker
        running many long jobs was most of its CPU per job (0.15% of a core each, measured by
        ``bench/watchdog_cpu.py``). A pidfd becomes readable when the process exits, so the wait
        sleeps in ``poll`` for the whole timeout. Without pidfds (not Linux, kernel < 5.3), the
        ``Popen`` way.
        """
        if self._pidfd is None:
            try:
                return exit_code_of(self._popen.wait(timeout=max(0.0, timeout_s)))
            except subprocess.TimeoutExpired:
                return None
        deadline = time.monotonic() + max(0.0, timeout_s)
        exited = False
        while True:
            returncode = self._popen.poll()
            if returncode is not None:
                return exit_code_of(returncode)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if exited:
                # It has exited, and another thread (a stop) holds Popen's reaping lock a moment.
                time.sleep(min(remaining, _REAP_RETRY_S))
                continue
            exit_poll = select.poll()
            exit_poll.register(self._pidfd, select.POLLIN)
            exited = bool(exit_poll.poll(remaining * 1000))

    @property
    def stopped_while_running(self) -> bool:
        """True when a stop found the main process still running: its exit is the stop's doing."""
        return self._stopped_running

    # --- signals ---------------------------------------------------------------------------

    def _signal_group(self, signal_number: int) -> bool:
        """Signal every process of the job's group; False when the group is gone."""
        try:
            os.killpg(self.pid, signal_number)
        except ProcessLookupError:
            return False
        except PermissionError:
            # A member changed its credentials (setuid); nothing more the worker can do.
            logger.warning("cannot signal the job's process group", extra=self.fields)
            return False
        return True

    def _group_alive(self) -> bool:
        return self._signal_group(0)

    def _group_gone(self) -> bool:
        """No member of the job's group is left but zombies.

        A zombie holds no GPU and no memory: it only waits for its parent (or, for an orphan, for
        PID 1, which in a container may never reap it) to collect its exit status. Counting one
        as alive would make every stop wait out its grace, and a dead job look unkillable.

        A full ``/proc`` scan runs at most every ``_SCAN_EVERY_S``, except when every member the
        last scan found has died since (a cheap check of those few pids): then at once.

        Only asked once the main process has exited. A gone group stays gone (nothing is left in
        it to fork or to let a process join), so the verdict is kept: the run thread (``finish``)
        and the stop thread both ask, and one's scan must not rate-limit the other's into waiting
        out the grace for a group of zombies.
        """
        if self._gone:
            return True
        if not self._group_alive():
            self._gone = True
            return True
        now = time.monotonic()
        members_left = any(is_live_member(pid, self.pid) for pid in self._members)
        if members_left and now - self._last_scan < _SCAN_EVERY_S:
            return False
        # The members the last scan saw are gone (or it is time to look for new ones): scan now,
        # so a job whose SIGTERM handler takes a moment is seen to end when it ends.
        self._last_scan = now
        self._members = live_group_members(self.pid)
        self._gone = not self._members
        return self._gone

    @property
    def survived_kill(self) -> bool:
        """True when a member of the group was still alive ``kill_wait_s`` after SIGKILL: stuck in
        uninterruptible sleep (a driver call), so whatever device it holds is not coming back."""
        return self._survived_kill

    def hint(self, signal_number: int) -> Hint:
        """Send a signal that asks rather than stops (SIGUSR1: save a checkpoint) to every process
        of the job's tree that handles it (``signal_handlers``), and to no other.

        Sent only while the main process has not been reaped and no stop has begun. SIGUSR1's
        default action ends a process, so a hint must never reach one without a handler (a shell
        wrapping the program, a job that has not installed its handler yet: a Python job does so
        after its imports); the program under the wrapper is the one that asked for it.
        ``sent``; ``unhandled`` (no process handles it yet: ask again later); ``gone`` (exited or
        stopping: never again). One scan of the tree per try (a few milliseconds, rare).
        """
        if self._stopping or self._popen.poll() is not None:
            return "gone"
        sent = 0
        for process in self._handlers(signal_number):
            try:
                process.send_signal(signal_number)  # checks the start time: never a reused pid
            except psutil.Error:
                continue
            sent += 1
        if sent:
            logger.debug("hint sent", extra={**self.fields, "signal": signal_number, "processes": sent})
            return "sent"
        return "unhandled"

    def _handlers(self, signal_number: int) -> list[psutil.Process]:
        """The job's processes that catch ``signal_number``: in its cgroup where it has one (the
        detached ones too), else in its process tree."""
        if self.cgroup is None:
            return signal_handlers(self.pid, signal_number)
        found = []
        for pid in self.cgroup.pids():
            if handles_signal(pid, signal_number, (b"SigCgt",)):
                with contextlib.suppress(psutil.Error):
                    found.append(psutil.Process(pid))
        return found

    def _cgroup_members(self) -> list[int]:
        return self.cgroup.pids() if self.cgroup is not None else []

    def stop(self) -> bool:
        """SIGTERM to the group, up to ``grace_s`` for it to go, then SIGKILL to the group.

        Done once: a second caller waits for the first caller's stop to finish. Returns whether the
        main process was still running when the stop began.
        """
        with self._stop_lock:
            first = not self._stopping
            self._stopping = True
        if not first:
            self._stop_done.wait()
            return self._stopped_running
        try:
            self._stopped_running = self._main_running()
            self._terminate_group(self.grace_s)
        finally:
            self._stop_done.set()
        return self._stopped_running

    def _main_running(self) -> bool:
        """The main process has not exited. ``Popen.poll()`` also answers None while another thread
        holds Popen's reaping lock, so a None is checked against ``/proc`` (a zombie has exited)."""
        if self._popen.poll() is not None:
            return False
        if not os.path.isdir(f"/proc/{os.getpid()}"):
            return True  # not Linux: poll's word
        return is_live_member(self.pid, self.pid)

    def _snapshot_descendants(self) -> None:
        try:
            self._descendants = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            self._descendants = []

    def _live_descendants(self) -> list[psutil.Process]:
        """The snapshot's processes still running (``is_running`` also checks the creation time, so
        a reused PID is never taken for one of them)."""
        alive = []
        for process in self._descendants:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.Error:
                continue
        return alive

    def _signal_descendants(self, signal_number: int) -> None:
        """Signal the snapshot's processes that left the job's group (the group signal reaches the
        others)."""
        for process in self._live_descendants():
            try:
                if os.getpgid(process.pid) == self.pid:
                    continue
                process.send_signal(signal_number)
            except (psutil.Error, OSError):
                continue

    def _all_gone(self) -> bool:
        return (
            self._popen.poll() is not None
            and self._group_gone()
            and not self._live_descendants()
            and not self._cgroup_members()
        )

    def _terminate_group(self, grace_s: float) -> None:
        if self._popen.poll() is not None and self._group_gone() and not self._cgroup_members():
            # Reaped and its group gone: the PID may already belong to someone else's group.
            return
        self._snapshot_descendants()
        group_signalled = self._signal_group(signal.SIGTERM)
        self._signal_descendants(signal.SIGTERM)
        detached = self._cgroup_members()
        for pid in detached:  # the ones that left the group and the tree (setsid -f, a double fork)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        if not group_signalled and not self._live_descendants() and not detached:
            self._popen.poll()
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self._all_gone():
                return
            time.sleep(_POLL_S)
        killed = self._signal_group(signal.SIGKILL)
        strays = self._live_descendants()
        self._signal_descendants(signal.SIGKILL)
        if self.cgroup is not None and self._cgroup_members():
            killed = True
            self.cgroup.kill()  # cgroup.kill, or freeze and kill: nothing it forks escapes
        if killed or strays:
            logger.info("job did not stop within the grace period; sent SIGKILL", extra=self.fields)
        deadline = time.monotonic() + self.kill_wait_s
        while True:
            if self._all_gone():
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        self._survived_kill = True
        logger.error(
            "job survived SIGKILL (uninterruptible sleep?)",
            extra={
                **self.fields,
                "survivors": live_group_members(self.pid) + [p.pid for p in self._live_descendants()],
            },
        )

    def finish(self) -> str:
        """After the main process exited: end what is left of its group, then return the tail.

        A job's processes do not outlive it: a background child still running when the shell
        exits gets the same SIGTERM, grace, SIGKILL sequence (it would also hold the output pipe
        open forever).
        """
        if not self._group_gone() or self._cgroup_members():
            if not self._stopping:
                logger.info("job left processes behind; stopping them", extra=self.fields)
            self.stop()
        if not self._output_ended.wait(_READER_JOIN_S):
            logger.debug("the job's output did not reach its end in time", extra=self.fields)
        self.close()
        return self.tail.text()

    def close(self) -> None:
        """Release the pidfd; ``wait`` falls back to polling afterwards. Idempotent."""
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)
