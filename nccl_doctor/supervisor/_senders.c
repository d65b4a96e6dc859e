/* Who sent the signals `nccl-doctor run` forwards to its job: the sender's pid, uid and the
 * kernel's si_code, kept by a SA_SIGINFO handler that then hands the signal on to the handler
 * it replaced (Python's), unchanged. Python's own handlers are not given the siginfo_t; this
 * is the one place that sees it. Optional: without it the report names the signal alone.
 *
 * watch(sig): install, keeping the handler in place; unwatch(sig): put it back;
 * last(sig): (pid, uid, code) of the latest such signal, or None; cleared when read. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <string.h>

#define MAX_SIG 65

static struct sigaction previous[MAX_SIG];
static volatile sig_atomic_t watched[MAX_SIG];
static volatile sig_atomic_t seen[MAX_SIG];
static volatile sig_atomic_t sender_pid[MAX_SIG], sender_uid[MAX_SIG], sender_code[MAX_SIG];

static void keep_sender(int sig, siginfo_t *info, void *context) {
    if (sig > 0 && sig < MAX_SIG) {
        if (info != NULL) {
            sender_pid[sig] = (sig_atomic_t)info->si_pid;
            sender_uid[sig] = (sig_atomic_t)info->si_uid;
            sender_code[sig] = (sig_atomic_t)info->si_code;
            seen[sig] = 1;
        }
        struct sigaction *was = &previous[sig];
        if (was->sa_flags & SA_SIGINFO) {
            if (was->sa_sigaction != NULL)
                was->sa_sigaction(sig, info, context);
        } else if (was->sa_handler != SIG_DFL && was->sa_handler != SIG_IGN &&
                   was->sa_handler != NULL) {
            was->sa_handler(sig);
        }
    }
}

static PyObject *watch(PyObject *self, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred())
        return NULL;
    if (sig <= 0 || sig >= MAX_SIG) {
        PyErr_SetString(PyExc_ValueError, "not a signal number");
        return NULL;
    }
    if (watched[sig])
        Py_RETURN_FALSE;
    struct sigaction now;
    if (sigaction((int)sig, NULL, &previous[sig]) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (!(previous[sig].sa_flags & SA_SIGINFO) &&
        (previous[sig].sa_handler == SIG_DFL || previous[sig].sa_handler == SIG_IGN))
        Py_RETURN_FALSE; /* no handler to hand it on to: its default is left alone */
    memset(&now, 0, sizeof now);
    now.sa_sigaction = keep_sender;
    now.sa_mask = previous[sig].sa_mask;
    now.sa_flags = (previous[sig].sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
    if (sigaction((int)sig, &now, NULL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    watched[sig] = 1;
    Py_RETURN_TRUE;
}

static PyObject *unwatch(PyObject *self, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred())
        return NULL;
    if (sig <= 0 || sig >= MAX_SIG || !watched[sig])
        Py_RETURN_FALSE;
    struct sigaction current;
    /* only where it is still ours: a handler installed since stays */
    if (sigaction((int)sig, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == keep_sender)
        sigaction((int)sig, &previous[sig], NULL);
    watched[sig] = 0;
    Py_RETURN_TRUE;
}

static PyObject *last(PyObject *self, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred())
        return NULL;
    if (sig <= 0 || sig >= MAX_SIG || !seen[sig])
        Py_RETURN_NONE;
    seen[sig] = 0;
    return Py_BuildValue("(lll)", (long)sender_pid[sig], (long)sender_uid[sig],
                         (long)sender_code[sig]);
}

static PyMethodDef methods[] = {
    {"watch", watch, METH_O, "Keep the sender of signal SIG, its handler left in place."},
    {"unwatch", unwatch, METH_O, "Put SIG's handler back as it was."},
    {"last", last, METH_O, "(pid, uid, si_code) of SIG's latest sender, or None; cleared."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_senders", NULL, -1, methods};

PyMODINIT_FUNC PyInit__senders(void) { return PyModule_Create(&module); }
