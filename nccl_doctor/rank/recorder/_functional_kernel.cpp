// The functional collectives' recording kernel in C++ (rank/recorder/functional.py says what is
// recorded and why at the dispatcher's ADInplaceOrView key; functional_kernel.py loads this).
//
// The Python kernel pays ~1.9 us a call before it records anything: the dispatcher boxes the
// call's arguments into Python objects and back. This kernel is the same hook written against the
// dispatcher: it records through the recorder's C fast path (capture/_ring.c's Recorded, reached
// through the ``_C_API`` capsule) and passes the call on below itself (redispatchBoxed) with its
// arguments as they came. What the fast path cannot record from the recorder's caches (a group,
// shape or callsite seen for the first time) it leaves to the Python path, as the Recorded of a
// torch.distributed function does: the call is then recorded by the same Python code as under
// the Python kernel, and passed on from there by ``run``. Two things the fast path would find
// out by walking the call's Python frames are remembered here instead (SiteMemo): the callsite
// of a call made from the same frames as the kernel's last one, and that of a call with no
// Python frame. The records are the Python kernel's, field for field
// (tests/integration/test_functional_kernel_records.py runs the two side by side).
//
// Built by setup.py against the torch it is installed with, never at run time; a build for
// another torch is refused before it is loaded (BUILT_FOR below, read from the file).
//
// Threads: the recorder's state is read and written under the GIL, as in Python. The dispatcher
// calls this kernel with or without the GIL (torch releases it around an operator call from
// Python; a Python kernel above this one, such as funcol's autograd one, may hold it); a kernel
// that took it gives it back around the call it passes on.
#include <Python.h>
#include <frameobject.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#ifndef NCCL_DOCTOR_BUILT_FOR
#error "setup.py defines NCCL_DOCTOR_BUILT_FOR: the torch version and git revision built against"
#endif

// Read from the file before it is loaded (functional_kernel.py): which torch this build is for.
extern "C" __attribute__((used)) const char nccl_doctor_built_for[] =
    "nccl-doctor functional kernel built for torch " NCCL_DOCTOR_BUILT_FOR "\n";

namespace {

// capture/_ring.c's RingAPI, declared again here (a C file and a C++ one share no header in this
// tree): its version and size are checked before it is used. Change both together.
constexpr unsigned int kRingApiVersion = 1;

struct RingAPI {
  unsigned int version;
  size_t size;
  size_t entered_size;
  int (*live)(PyObject* recorded);
  int (*enter)(PyObject* recorded, PyObject* const* args, Py_ssize_t nargs, const uint64_t* site,
               void* entered);
  uint64_t (*index)(const void* entered);
  uint64_t (*epoch)(PyObject* recorded);
  PyObject* (*positions)(PyObject* recorded);
  PyObject* (*paths)(PyObject* recorded);
  int (*fields)(PyObject* recorded, uint64_t idx, uint64_t* bits);
  int (*leave)(PyObject* recorded, void* entered, int failed);
  int (*wait_enter)(PyObject* recording, uint64_t parent, unsigned int op,
                    unsigned int functional, unsigned int kinds, unsigned int wait_kind,
                    void* entered);
  void (*wait_leave)(void* entered, int state);
};

const RingAPI* api = nullptr;

// Room for the ring's Entered (four pointers and two integers there): checked at install.
struct alignas(16) Entered {
  unsigned char bytes[128];
};

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// The GIL for this scope: taken unless this thread holds it; a Released gives it back around a
// call passed on (when this kernel took it: a caller that held it keeps holding it, as it would
// without the recorder).
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;
  bool taken() const { return state_ == PyGILState_UNLOCKED; }

 private:
  PyGILState_STATE state_;
};

class Released {
 public:
  explicit Released(bool release) : save_(release ? PyEval_SaveThread() : nullptr) {}
  ~Released() {
    if (save_ != nullptr) PyEval_RestoreThread(save_);
  }
  Released(const Released&) = delete;
  Released& operator=(const Released&) = delete;

 private:
  PyThreadState* save_;
};

// An error of Python's (set now) thrown through the dispatcher to the Python caller, as torch's
// own Python kernels do.
[[noreturn]] void throw_python_error() {
  python_error err;
  err.persist();
  throw err;
}

// -- the collectives whose wait_tensor is still to come ---------------------------------------
// A recorded collective's output tensor -> its record, as functional.py's _ISSUED for the Python
// kernel: at most ``max_issued`` of them, the oldest forgotten first. Kept flat, in memory
// allocated once (noting one is on every call, and forgetting the oldest on every call of a
// program that never waits): the entries in the order noted, in a ring of twice that many slots
// (an entry a wait took leaves a hole, given back when the ring is compacted), and an
// open-addressing index from the tensor to its slot. An entry holds the tensor weakly: its
// address is not reused while it is noted. Under the GIL; ``issued_count`` is read without it
// (a wait with nothing outstanding passes on without taking the GIL).
using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

WeakTensor no_tensor() {
  return WeakTensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
}

struct Issued {
  c10::TensorImpl* key = nullptr;  // nullptr: a hole
  WeakTensor ref = no_tensor();
  uint64_t idx = 0;
};

struct Index {
  c10::TensorImpl* key = nullptr;  // nullptr: empty
  uint32_t slot = 0;
};

std::vector<Issued> ring;  // 2 * max_issued slots; the entries from ``head``, ``used`` slots on
size_t head = 0, used = 0, live = 0;
std::vector<Index> index_;  // a power of two >= 4 * max_issued (at most a quarter full)
size_t index_bits = 0;
std::atomic<size_t> issued_count{0};
size_t max_issued = 4096;

size_t home(const c10::TensorImpl* key) {  // Fibonacci hashing of the address
  uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(h >> (64 - index_bits));
}

size_t find(const c10::TensorImpl* key) {  // its index position, or index_.size()
  const size_t mask = index_.size() - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    if (index_[i].key == key) return i;
    if (index_[i].key == nullptr) return index_.size();
  }
}

void index_put(c10::TensorImpl* key, size_t slot) {
  const size_t mask = index_.size() - 1;
  size_t i = home(key);
  while (index_[i].key != nullptr) i = (i + 1) & mask;
  index_[i] = Index{key, static_cast<uint32_t>(slot)};
}

void index_erase(size_t i) {  // linear probing's deletion: the entries after it moved back
  const size_t mask = index_.size() - 1;
  size_t j = i;
  index_[i].key = nullptr;
  for (;;) {
    j = (j + 1) & mask;
    if (index_[j].key == nullptr) return;
    size_t k = home(index_[j].key);
    // the entry at j stays unless its home lies cyclically outside (i, j]
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      index_[i] = index_[j];
      index_[j].key = nullptr;
      i = j;
    }
  }
}

void forget_issued() {
  ring.assign(2 * max_issued, Issued{});
  head = used = live = 0;
  index_bits = 2;
  while ((size_t{1} << index_bits) < 4 * max_issued) ++index_bits;
  index_.assign(size_t{1} << index_bits, Index{});
  issued_count.store(0, std::memory_order_relaxed);
}

void drop(size_t slot) {  // (its index entry already gone)
  ring[slot].key = nullptr;
  ring[slot].ref = no_tensor();
  --live;
}

// The holes at the head given back; then, when the ring is full, its entries moved together
// (those whose tensor is gone go too: nothing can wait for them).
void make_room() {
  while (used > 0 && ring[head].key == nullptr) {
    head = (head + 1) % ring.size();
    --used;
  }
  if (used < ring.size()) return;
  std::vector<Issued> kept(ring.size());
  size_t n = 0;
  std::fill(index_.begin(), index_.end(), Index{});
  for (size_t i = 0; i < used; ++i) {
    Issued& e = ring[(head + i) % ring.size()];
    if (e.key == nullptr || e.ref.expired()) continue;
    index_put(e.key, n);
    kept[n++] = std::move(e);
  }
  ring.swap(kept);
  head = 0, used = live = n;
}

void note_tensor(const at::Tensor& t, uint64_t idx) {
  if (!t.defined()) return;
  c10::TensorImpl* key = t.unsafeGetTensorImpl();
  size_t at = find(key);
  if (at < index_.size()) {  // noted again: its place kept, as a dict's
    ring[index_[at].slot].ref = WeakTensor(t.getIntrusivePtr());
    ring[index_[at].slot].idx = idx;
    return;
  }
  make_room();
  size_t slot = (head + used) % ring.size();
  ring[slot].key = key;
  ring[slot].ref = WeakTensor(t.getIntrusivePtr());
  ring[slot].idx = idx;
  ++used, ++live;
  index_put(key, slot);
}

void forget_oldest() {  // when ``max_issued`` are noted
  make_room();  // (the head is then an entry; a compaction may have made room)
  if (live < max_issued || used == 0) return;
  index_erase(find(ring[head].key));
  drop(head);
}

// The outputs of a call (what its redispatch left on the stack) noted with record ``idx``.
void note_outputs(const torch::jit::Stack& stack, size_t returns, uint64_t idx) {
  if (idx == 0 || returns == 0 || stack.size() < returns) return;
  if (live >= max_issued) forget_oldest();
  for (size_t i = stack.size() - returns; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      note_tensor(v.toTensor(), idx);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) note_tensor(t, idx);
    }
  }
  issued_count.store(live, std::memory_order_relaxed);
}

// The record of the collective whose output ``key`` is (0: none), forgotten as it is taken.
uint64_t take_issued(c10::TensorImpl* key) {
  size_t at = find(key);
  if (at == index_.size()) return 0;
  size_t slot = index_[at].slot;
  index_erase(at);
  uint64_t idx = ring[slot].ref.expired() ? 0 : ring[slot].idx;
  drop(slot);
  issued_count.store(live, std::memory_order_relaxed);
  return idx;
}

// How the calls went, for the tests: recorded by the fast path, by the Python path, or passed
// on unrecorded (a subclass, the meta device, no capture open); the same for the waits.
// (issue_fast_known: by the fast path, with the callsite of the kernel's last call)
enum Count {
  ISSUE_FAST, ISSUE_FAST_KNOWN, ISSUE_PYTHON, ISSUE_PASSED, WAIT_FAST, WAIT_PYTHON, WAIT_PASSED,
  COUNTS
};
const char* const count_names[COUNTS] = {"issue_fast", "issue_fast_known", "issue_python",
                                         "issue_passed", "wait_fast", "wait_python",
                                         "wait_passed"};
std::atomic<uint64_t> counts[COUNTS];

void count(Count what) {
  counts[what].fetch_add(1, std::memory_order_relaxed);
}

// -- the gate ----------------------------------------------------------------------------------
// functional.py's _plain: the call's first tensor (the first of a list of them) is a torch.Tensor
// or Parameter, not a subclass (FakeTensor, FunctionalTensor, DTensor). Asked only while the
// Python key is on (a dispatch mode, or such a subclass). The GIL is held.
bool plain_tensor(const at::Tensor& t) {
  PyObject* obj = THPVariable_Wrap(t);
  if (obj == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
  bool plain = type == THPVariableClass || type == ParameterClass;
  Py_DECREF(obj);
  return plain;
}

bool plain_call(const torch::jit::Stack& stack, size_t first, size_t n) {
  for (size_t i = first; i < first + n; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) return plain_tensor(v.toTensor());
    if (v.isTensorList()) {
      auto list = v.toTensorList();
      if (list.size() > 0) return plain_tensor(list.get(0));
    } else if (v.isList()) {
      auto list = v.toList();
      if (list.size() > 0 && list.get(0).isTensor()) return plain_tensor(list.get(0).toTensor());
    }
  }
  return false;
}

// -- a call passed on from the Python path ----------------------------------------------------
// While the Python path records a call the fast path declined, the call itself waits here for
// ``run`` (the ``fn`` the Python path calls); ``note`` gives it the record its outputs complete.
struct Pending {
  const c10::OperatorHandle* op;
  c10::DispatchKeySet below;
  torch::jit::Stack* stack;
  bool release_gil;
  bool ran = false;
  std::exception_ptr error;
  uint64_t noted = 0;
};

thread_local Pending* pending = nullptr;

PyObject* to_python(const c10::IValue& v) {
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  try {
    return torch::jit::toPyObject(v).release().ptr();
  } catch (...) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an argument Python cannot hold");
    return nullptr;
  }
}

// -- the callsite of the last call ------------------------------------------------------------
// A call's callsite fields (the user's file, line and function, the API's caller, the call path)
// follow from its Python frames alone, from the current one out to the first of the user's: the
// fast path walks them on every call, looking each up in the recorder's caches, which costs more
// the deeper the call is made (funcol's own Python autograd kernel puts four frames of torch's
// between the user's line and this kernel). A kernel remembers the frames of its last call that
// a record was walked for - code object and instruction offset each, the code objects held so
// that no other can take their address - and the fields that record got; a call from the same
// frames, in the same epoch of the recorder (capture/_ring.c's Recording.epoch: its caches and
// string ids the same), gets the same fields without the walk. The capture/_ring.c Call keeps
// the same memo for one frame; this one is for the frames above a kernel.
constexpr size_t kMaxMemoFrames = 32;

int frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(f);
#else
  return f->f_lasti;
#endif
}

struct SiteMemo {
  bool valid = false;
  bool whole = false;  // no user's frame: the walk went through every frame (the last is the top)
  uint64_t epoch = 0;
  std::vector<std::pair<PyObject*, int>> frames;  // innermost first; code references
  uint64_t site[6] = {0, 0, 0, 0, 0, 0};

  void clear() {
    for (auto& [code, lasti] : frames) Py_DECREF(code);
    frames.clear();
    valid = whole = false;
  }

  // Whether the current frames are the remembered ones (the GIL is held).
  bool matches(uint64_t now) const {
    if (!valid || now != epoch) return false;
    PyFrameObject* f = PyEval_GetFrame();
    if (f == nullptr) return false;
    Py_INCREF(f);
    bool same = true;
    for (size_t i = 0; i < frames.size(); ++i) {
      PyCodeObject* code = PyFrame_GetCode(f);
      same = reinterpret_cast<PyObject*>(code) == frames[i].first &&
             frame_lasti(f) == frames[i].second;
      Py_DECREF(code);
      if (!same) break;
      if (i + 1 == frames.size()) {
        if (whole) {  // (and no frame above it)
          PyFrameObject* back = PyFrame_GetBack(f);
          same = back == nullptr;
          Py_XDECREF(back);
        }
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
      if (f == nullptr) {
        same = false;
        break;
      }
    }
    Py_XDECREF(f);
    return same;
  }

  // After record ``idx`` was entered by a walk of the current frames: the frames the walk went
  // through (as Describer.callsites and capture/_ring.c's callsite stop: at the first frame that
  // is neither internal nor a library's; with none, at the top) and the fields it wrote. Nothing
  // is remembered when a frame is not in the recorder's caches or there are too many.
  void learn(PyObject* recorded, uint64_t now, uint64_t idx) {
    clear();
    PyObject* positions = api->positions(recorded);
    uint64_t bits[22];
    if (!PyDict_CheckExact(positions) || api->fields(recorded, idx, bits) < 0) return;
    PyFrameObject* f = PyEval_GetFrame();
    Py_XINCREF(f);
    bool found = false;
    while (f != nullptr && frames.size() < kMaxMemoFrames) {
      PyCodeObject* code = PyFrame_GetCode(f);
      int lasti = frame_lasti(f);
      frames.emplace_back(reinterpret_cast<PyObject*>(code), lasti);  // (the reference kept)
      PyObject* key = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), lasti);
      PyObject* info = key == nullptr ? nullptr : PyDict_GetItemWithError(positions, key);
      Py_XDECREF(key);
      if (info == nullptr || !PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != 6) break;
      int library = PyObject_IsTrue(PyTuple_GET_ITEM(info, 0));
      int internal = PyObject_IsTrue(PyTuple_GET_ITEM(info, 1));
      if (library < 0 || internal < 0) break;
      if (!internal && !library) {
        found = true;
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
    }
    whole = !found && f == nullptr && !PyErr_Occurred() && !frames.empty();
    Py_XDECREF(f);
    PyErr_Clear();
    if (!found && !whole) {
      clear();
      return;
    }
    std::memcpy(site, &bits[10], sizeof site);
    epoch = now;
    valid = true;
  }
};

// -- the kernels -------------------------------------------------------------------------------
// Python objects the kernels use: references held by ``held`` from install to uninstall (never
// released at exit: the dispatcher may outlive the interpreter).
std::vector<PyObject*> held;

PyObject* hold(PyObject* obj) {
  Py_INCREF(obj);
  held.push_back(obj);
  return obj;
}

// One collective operator: its record (a capture/_ring.c Recorded), the Python path that records
// what the fast path declines, and which of its arguments the fast path reads.
struct IssueKernel final : c10::OperatorKernel {
  PyObject* recorded;
  PyObject* slow;
  std::vector<bool> needed;
  std::string group_text;       // the group name last converted,
  PyObject* group_obj = nullptr;  // and its str (a reference)
  SiteMemo memo;

  IssueKernel(PyObject* recorded_, PyObject* slow_, std::vector<bool> needed_)
      : recorded(recorded_), slow(slow_), needed(std::move(needed_)) {}

  ~IssueKernel() override {
    if (Py_IsInitialized() && !finalizing()) {
      PyGILState_STATE g = PyGILState_Ensure();
      Py_CLEAR(group_obj);
      memo.clear();
      PyGILState_Release(g);
    }
  }

  // The callsite fields of a call with no Python frame (a C++ thread's: TorchScript's fork, the
  // autograd engine's device threads, AOTInductor): what the Python path writes for one - no
  // user's line, no API caller, the empty call path (Describer.callsites from this file's frame
  // alone) - once that path is in the recorder's caches (the first such call puts it there);
  // else nullptr: the Python path records the call.
  const uint64_t* frameless_site(uint64_t* site) {
    PyObject* paths = api->paths(recorded);
    if (!PyDict_CheckExact(paths)) return nullptr;
    PyObject* empty = PyTuple_New(0);
    PyObject* id = empty == nullptr ? nullptr : PyDict_GetItemWithError(paths, empty);
    Py_XDECREF(empty);
    if (id == nullptr || !PyLong_CheckExact(id)) {
      PyErr_Clear();
      return nullptr;
    }
    unsigned long long path = PyLong_AsUnsignedLongLong(id);
    if (PyErr_Occurred() || path > UINT32_MAX) {
      PyErr_Clear();
      return nullptr;
    }
    site[0] = site[1] = site[2] = site[3] = site[4] = 0;
    site[5] = path;
    return site;
  }

  // An argument as the fast path reads it (a new reference); a group name's str is reused.
  PyObject* argument(const c10::IValue& v) {
    if (v.isString()) {
      const std::string& s = v.toStringRef();
      if (group_obj == nullptr || s != group_text) {
        PyObject* obj = PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
        if (obj == nullptr) return nullptr;
        Py_XSETREF(group_obj, obj);
        group_text = s;
      }
      return Py_NewRef(group_obj);
    }
    return to_python(v);
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack) {
    const c10::DispatchKeySet below = ks & c10::after_ADInplaceOrView_keyset;
    const size_t n = op.schema().arguments().size();
    if (ks.has(c10::DispatchKey::Meta) || stack->size() < n || finalizing()) {
      count(ISSUE_PASSED);
      op.redispatchBoxed(below, stack);
      return;
    }
    Gil gil;
    const size_t first = stack->size() - n;
    if ((ks.has(c10::DispatchKey::Python) && !plain_call(*stack, first, n)) ||
        !api->live(recorded)) {
      count(ISSUE_PASSED);
      Released released(gil.taken());
      op.redispatchBoxed(below, stack);
      return;
    }
    const size_t returns = op.schema().returns().size();
    const uint64_t epoch = api->epoch(recorded);
    uint64_t frameless[6];
    const uint64_t* site = nullptr;
    if (PyEval_GetFrame() == nullptr) {
      site = frameless_site(frameless);
    } else if (memo.matches(epoch)) {
      site = memo.site;
    }
    const bool known = site != nullptr;
    Entered entered;
    int r = enter(*stack, first, n, site, &entered);
    if (r < 0) throw_python_error();
    if (r == 0) {
      count(ISSUE_PYTHON);
      run_python(op, below, stack, first, n, returns, gil.taken());
      return;
    }
    count(known ? ISSUE_FAST_KNOWN : ISSUE_FAST);
    uint64_t idx = api->index(&entered);
    if (!known) memo.learn(recorded, epoch, idx);
    try {
      Released released(gil.taken());
      op.redispatchBoxed(below, stack);
    } catch (...) {
      api->leave(recorded, &entered, 1);
      throw;
    }
    note_outputs(*stack, returns, idx);
    if (api->leave(recorded, &entered, 0) < 0) throw_python_error();
  }

  // The fast path's enter, with the arguments it reads as Python objects (None for the rest).
  int enter(const torch::jit::Stack& stack, size_t first, size_t n, const uint64_t* site,
            Entered* entered) {
    PyObject* small[16];
    std::vector<PyObject*> large;
    PyObject** args = small;
    if (n > 16) {
      large.resize(n);
      args = large.data();
    }
    size_t made = 0;
    int r = 0;
    for (; made < n; ++made) {
      PyObject* obj = needed[made] ? argument(stack[first + made]) : Py_NewRef(Py_None);
      if (obj == nullptr) break;
      args[made] = obj;
    }
    if (made == n) {
      r = api->enter(recorded, args, static_cast<Py_ssize_t>(n), site, entered);
    } else {
      PyErr_Clear();  // an argument Python cannot hold: the Python path decides
    }
    for (size_t i = 0; i < made; ++i) Py_DECREF(args[i]);
    return r;
  }

  // The Python path: every argument converted, the call passed on by ``run`` from there.
  void run_python(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                  torch::jit::Stack* stack, size_t first, size_t n, size_t returns,
                  bool release_gil) {
    PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(n));
    if (args == nullptr) throw_python_error();
    for (size_t i = 0; i < n; ++i) {
      PyObject* obj = to_python((*stack)[first + i]);
      if (obj == nullptr) {  // not a call the recorder can describe: passed on unrecorded
        PyErr_Clear();
        Py_DECREF(args);
        Released released(release_gil);
        op.redispatchBoxed(below, stack);
        return;
      }
      PyTuple_SET_ITEM(args, static_cast<Py_ssize_t>(i), obj);
    }
    Pending p{&op, below, stack, release_gil};
    Pending* outer = pending;
    pending = &p;
    PyObject* result = PyObject_Call(slow, args, nullptr);
    pending = outer;
    Py_DECREF(args);
    if (result == nullptr) {
      if (p.error) {  // the call's own error: the caller's, unchanged
        PyErr_Clear();
        std::rethrow_exception(p.error);
      }
      throw_python_error();
    }
    Py_DECREF(result);
    if (!p.ran) {  // (the Python path always passes the call on; should it not, this does)
      Released released(release_gil);
      op.redispatchBoxed(below, stack);
      return;
    }
    note_outputs(*stack, returns, p.noted);
  }
};

// wait_tensor: a WAIT record under the collective whose output it waits for, when that was
// recorded; anything else passes on (without the GIL when no recorded output is outstanding).
struct WaitKernel final : c10::OperatorKernel {
  PyObject* recording;  // the recorder's capture/_ring.c Recording
  PyObject* recorder;   // for its ``_wait_op`` (the string id of "wait")
  PyObject* enter_slow;  // (parent) -> a token for leave_slow, or None: no record
  PyObject* leave_slow;  // (token, failed)
  PyObject* wait_op_name;
  unsigned int functional, kinds, wait_kind;
  int returned, failed;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack) {
    const c10::DispatchKeySet below = ks & c10::after_ADInplaceOrView_keyset;
    if (issued_count.load(std::memory_order_relaxed) == 0 || ks.has(c10::DispatchKey::Meta) ||
        stack->empty() || !stack->back().isTensor() || finalizing()) {
      count(WAIT_PASSED);
      op.redispatchBoxed(below, stack);
      return;
    }
    Gil gil;
    const at::Tensor& tensor = stack->back().toTensor();
    uint64_t parent = 0;
    if (!ks.has(c10::DispatchKey::Python) || plain_tensor(tensor))
      parent = take_issued(tensor.unsafeGetTensorImpl());
    if (parent == 0) {
      count(WAIT_PASSED);
      Released released(gil.taken());
      op.redispatchBoxed(below, stack);
      return;
    }
    Entered entered;
    PyObject* token = nullptr;
    bool fast = enter(parent, &entered);
    if (!fast) {
      token = PyObject_CallFunction(enter_slow, "K", static_cast<unsigned long long>(parent));
      if (token == nullptr) throw_python_error();
      if (token == Py_None) {
        Py_CLEAR(token);
        count(WAIT_PASSED);
        Released released(gil.taken());
        op.redispatchBoxed(below, stack);
        return;
      }
    }
    count(fast ? WAIT_FAST : WAIT_PYTHON);
    try {
      Released released(gil.taken());
      op.redispatchBoxed(below, stack);
    } catch (...) {
      leave(fast, &entered, token, true);
      throw;
    }
    leave(fast, &entered, token, false);
  }

  bool enter(uint64_t parent, Entered* entered) {
    PyObject* op_obj = PyObject_GetAttr(recorder, wait_op_name);
    if (op_obj == nullptr) {
      PyErr_Clear();
      return false;
    }
    unsigned long wait_op = PyLong_AsUnsignedLong(op_obj);
    Py_DECREF(op_obj);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return api->wait_enter(recording, parent, static_cast<unsigned int>(wait_op), functional,
                           kinds, wait_kind, entered) == 1;
  }

  void leave(bool fast, Entered* entered, PyObject* token, bool failed_call) {
    if (fast) {
      api->wait_leave(entered, failed_call ? failed : returned);
      return;
    }
    PyObject* out = PyObject_CallFunction(leave_slow, "OO", token,
                                          failed_call ? Py_True : Py_False);
    Py_DECREF(token);
    if (out == nullptr) {
      if (failed_call) {
        PyErr_Clear();  // the call's own error is the one to raise
        return;
      }
      throw_python_error();
    }
    Py_DECREF(out);
  }
};

// The registrations, one library per namespace; deleted (which takes the kernels out) by
// uninstall, never at exit.
std::vector<std::pair<std::string, torch::Library*>> libraries;

torch::Library& library_for(const std::string& ns) {
  for (auto& [name, lib] : libraries) {
    if (name == ns) return *lib;
  }
  auto* lib = new torch::Library(torch::Library::IMPL, ns, std::nullopt, __FILE__, __LINE__);
  libraries.emplace_back(ns, lib);
  return *lib;
}

void uninstall_all() {
  for (auto& [name, lib] : libraries) delete lib;
  libraries.clear();
  forget_issued();
  for (PyObject* obj : held) Py_DECREF(obj);
  held.clear();
}

bool load_api() {
  if (api != nullptr) return true;
  auto* found = static_cast<const RingAPI*>(
      PyCapsule_Import("nccl_doctor.capture._ring._C_API", 0));
  if (found == nullptr) return false;
  if (found->version != kRingApiVersion || found->size != sizeof(RingAPI) ||
      found->entered_size > sizeof(Entered)) {
    PyErr_Format(PyExc_ImportError,
                 "nccl_doctor.capture._ring's C API is version %u (%zu bytes), not the %u "
                 "(%zu bytes) this kernel was built for: rebuild both (make install)",
                 found->version, found->size, kRingApiVersion, sizeof(RingAPI));
    return false;
  }
  api = found;
  return true;
}

// -- the module ----------------------------------------------------------------------------------

// install(kernels, wait, max_issued): kernels a list of (namespace, name, recorded, slow,
// needed), ``needed`` the positions of the schema's arguments the fast path reads; wait None or
// (namespace, recording, recorder, enter_slow, leave_slow, functional, kinds, wait_kind,
// returned, failed).
PyObject* py_install(PyObject*, PyObject* args) {
  PyObject *kernels, *wait;
  Py_ssize_t max;
  if (!PyArg_ParseTuple(args, "O!On", &PyList_Type, &kernels, &wait, &max)) return nullptr;
  if (!load_api()) return nullptr;
  try {
    uninstall_all();
    max_issued = static_cast<size_t>(max > 0 ? max : 1);
    forget_issued();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernels); ++i) {
      const char *ns, *name;
      PyObject *recorded, *slow, *needed;
      if (!PyArg_ParseTuple(PyList_GET_ITEM(kernels, i), "ssOOO!", &ns, &name, &recorded, &slow,
                            &PyTuple_Type, &needed))
        throw_python_error();
      auto handle = c10::Dispatcher::singleton().findSchema({std::string(ns) + "::" + name, ""});
      if (!handle) {
        PyErr_Format(PyExc_LookupError, "no operator %s::%s", ns, name);
        throw_python_error();
      }
      std::vector<bool> mask(handle->schema().arguments().size(), false);
      for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(needed); ++j) {
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(needed, j));
        if (pos == -1 && PyErr_Occurred()) throw_python_error();
        if (pos >= 0 && static_cast<size_t>(pos) < mask.size()) mask[pos] = true;
      }
      auto kernel = std::make_unique<IssueKernel>(hold(recorded), hold(slow), std::move(mask));
      library_for(ns).impl(name, torch::dispatch(c10::DispatchKey::ADInplaceOrView,
                                                 torch::CppFunction::makeFromBoxedFunctor(
                                                     std::move(kernel))));
    }
    if (wait != Py_None) {
      const char* ns;
      PyObject *recording, *recorder, *enter_slow, *leave_slow;
      unsigned int functional, kinds, wait_kind;
      int returned, failed;
      if (!PyArg_ParseTuple(wait, "sOOOOIIIii", &ns, &recording, &recorder, &enter_slow,
                            &leave_slow, &functional, &kinds, &wait_kind, &returned, &failed))
        throw_python_error();
      auto kernel = std::make_unique<WaitKernel>();
      kernel->recording = hold(recording);
      kernel->recorder = hold(recorder);
      kernel->enter_slow = hold(enter_slow);
      kernel->leave_slow = hold(leave_slow);
      PyObject* attr = PyUnicode_InternFromString("_wait_op");
      if (attr == nullptr) throw_python_error();
      kernel->wait_op_name = hold(attr);
      Py_DECREF(attr);
      kernel->functional = functional, kernel->kinds = kinds, kernel->wait_kind = wait_kind;
      kernel->returned = returned, kernel->failed = failed;
      library_for(ns).impl("wait_tensor", torch::dispatch(c10::DispatchKey::ADInplaceOrView,
                                                          torch::CppFunction::makeFromBoxedFunctor(
                                                              std::move(kernel))));
    }
  } catch (python_error& err) {
    uninstall_all();
    err.restore();
    return nullptr;
  } catch (const std::exception& err) {
    uninstall_all();
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  uninstall_all();
  Py_RETURN_NONE;
}

// run(*args): the call the Python path records, passed on (its arguments are the ones the
// dispatcher gave the kernel, not these); its error raised as a RuntimeError, which the kernel
// turns back into the original once the Python path has recorded it.
PyObject* py_run(PyObject*, PyObject*) {
  Pending* p = pending;
  if (p == nullptr || p->ran) {
    PyErr_SetString(PyExc_RuntimeError, "no functional collective is waiting to run");
    return nullptr;
  }
  p->ran = true;
  {
    Released released(p->release_gil);
    try {
      p->op->redispatchBoxed(p->below, p->stack);
    } catch (...) {
      p->error = std::current_exception();
    }
  }
  if (p->error) {
    std::string what = "the functional collective raised";
    try {
      std::rethrow_exception(p->error);
    } catch (const std::exception& err) {
      what = err.what();
    } catch (...) {
    }
    PyErr_SetString(PyExc_RuntimeError, what.c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// note(idx): the record the outputs of the call being run complete (for their wait_tensor).
PyObject* py_note(PyObject*, PyObject* arg) {
  unsigned long long idx = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  if (pending != nullptr) pending->noted = idx;
  Py_RETURN_NONE;
}

// forget(): no collective is outstanding (a forked child: its parent's are not its own).
PyObject* py_forget(PyObject*, PyObject*) {
  forget_issued();
  Py_RETURN_NONE;
}

PyObject* py_outstanding(PyObject*, PyObject*) {
  return PyLong_FromSize_t(live);
}

// counts(): how the calls went since the process started, by name (see Count).
PyObject* py_counts(PyObject*, PyObject*) {
  PyObject* out = PyDict_New();
  for (int i = 0; out != nullptr && i < COUNTS; ++i) {
    PyObject* v = PyLong_FromUnsignedLongLong(counts[i].load(std::memory_order_relaxed));
    if (v == nullptr || PyDict_SetItemString(out, count_names[i], v) < 0) Py_CLEAR(out);
    Py_XDECREF(v);
  }
  return out;
}

PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS, "Register the kernels (see the source)."},
    {"uninstall", py_uninstall, METH_NOARGS, "Take the kernels out."},
    {"run", py_run, METH_VARARGS, "Pass on the call the Python path records."},
    {"note", py_note, METH_O, "The record the running call's outputs complete."},
    {"forget", py_forget, METH_NOARGS, "Forget the collectives whose wait is still to come."},
    {"outstanding", py_outstanding, METH_NOARGS, "Collectives whose wait is still to come."},
    {"counts", py_counts, METH_NOARGS, "How the calls went: recorded fast, in Python, or not."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_functional_kernel",
    "The functional collectives' recording kernel in C++ (see functional_kernel.py).", -1,
    methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__functional_kernel() {
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  if (PyModule_AddStringConstant(m, "BUILT_FOR", NCCL_DOCTOR_BUILT_FOR) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
