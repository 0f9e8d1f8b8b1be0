"""dt's stack hook for programs run under dtrun (its directory is put first on their PYTHONPATH).

When dt captures a hung rank's stacks, it asks each Python process for its frames through a signal:
this registers faulthandler on that signal (all threads, file:line and function, written by the
interpreter from C even while a C extension holds the GIL) and tells dt where the dump goes, in
<DT_STACKS_DIR>/<pid>.hook. A process forked from this one registers again under its own pid. It
costs an open file and one signal handler; the program's code is not touched, and a script that
never imports dt has it all the same.

Python imports only the first sitecustomize on its path: this one runs the next one found after
it (Debian's own, or a user's), so theirs still runs.
"""


def _dt_install_stack_hook():
    import os
    import sys

    hooks_dir = os.environ.get("DT_STACKS_DIR")
    if not hooks_dir:
        return
    # The C modules: `signal` and `threading` import enum and more, ~8 ms at every start of every
    # rank on a slow host, for one constant and one thread id.
    import _thread
    import faulthandler

    try:
        import _signal
    except ImportError:
        import signal as _signal
    try:
        signum = int(os.environ.get("DT_STACK_SIGNAL", "0")) or (_signal.SIGRTMAX - 2)
    except ValueError:
        return
    state = {}

    def start_ticks():
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])

    # Called at the start and in a forked child: both times on what threading calls the main thread
    # (in a child, the thread that forked), so _thread.get_ident() is threading.main_thread().ident.
    def install():
        old = state.pop("dump", None)
        if old is not None:
            old.close()
        pid = os.getpid()
        dump_path = os.path.join(hooks_dir, "%d.dump" % pid)
        dump = open(dump_path, "w")
        faulthandler.register(signum, file=dump, all_threads=True, chain=False)
        state["dump"] = dump  # kept open for the process's life: faulthandler writes to its descriptor
        # Under Yama's ptrace_scope 1 the capturer (dtrun) may attach only if this process says so.
        # Elsewhere the call changes nothing, and ctypes costs ~3 ms to import.
        ptracer = os.environ.get("DT_PTRACER")
        if ptracer and _yama_restricts_ptrace():
            try:
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, int(ptracer), 0, 0, 0)  # PR_SET_PTRACER
            except Exception:
                pass
        tmp = os.path.join(hooks_dir, ".%d.hook.tmp" % pid)
        with open(tmp, "w") as f:
            f.write("pid=%d\nstart=%d\nsignal=%d\nmain_thread=%d\ndump=%s\n"
                    % (pid, start_ticks(), signum, _thread.get_ident(), dump_path))
        os.replace(tmp, os.path.join(hooks_dir, "%d.hook" % pid))

    try:
        install()
        os.register_at_fork(after_in_child=lambda: _dt_safely(install))
    except Exception as e:  # never stop the user's program for dt's hook
        sys.stderr.write("dt: stack hook not installed: %s\n" % e)


def _yama_restricts_ptrace():
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", "rb") as f:
            return f.read().strip() == b"1"
    except FileNotFoundError:  # no Yama: any process of the same user may attach
        return False
    except OSError:  # unreadable: assume the restriction
        return True


def _dt_safely(f):
    try:
        f()
    except Exception:
        pass


def _dt_run_next_sitecustomize():
    """Runs the sitecustomize this one shadows (the first found after this file's directory)."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    past = False
    for entry in list(sys.path):
        d = os.path.abspath(entry or os.getcwd())
        if not past:
            past = d == here
            continue
        candidate = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(candidate):
            # The loader alone: importlib.util would import contextlib and collections (~5 ms).
            from importlib.machinery import SourceFileLoader

            loader = SourceFileLoader("_dt_shadowed_sitecustomize", candidate)
            module = type(sys)(loader.name)
            module.__file__ = candidate
            module.__loader__ = loader
            loader.exec_module(module)
            return


_dt_safely(_dt_install_stack_hook)
try:
    _dt_run_next_sitecustomize()
except Exception as e:
    import sys

    sys.stderr.write("dt: the sitecustomize after dt's failed: %s\n" % e)
