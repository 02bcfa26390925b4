//! Pytrees shared as one segment (`dlpack.share_tree`): `TreeSegment`, what the Python
//! `SharedTree` holds. The segment's layout (header, table, structure, leaves) and its
//! sequence lock are the core's (`dlpack_core::share::{tree, seqlock}`); the Python side
//! flattens the tree and writes and reads its structure (opaque bytes here).
//!
//! One segment, mapped once per process as any other, and one handle: pickling a tree pickles
//! the handle of a view of all of its segment (`state::write`), which the receiver opens as it
//! opens any handle (`state::open`), then reads the header and table, checked, from the memory.
//!
//! Writers (the lender, receivers of a writable handle) write through their shared mapping,
//! holding the writers' lock (`WriteLock`, through a description of this process's own) and
//! their process's turn (`lock::Writers`, kept with the mapping): the lock keeps other
//! processes' writers out, the turn this process's other threads, which share its description
//! and so its lock. Readers copy the leaves out whole under the sequence lock, never writing (so
//! they never hold a writer up), whether the writer is another process or a thread of their
//! own; a thread of theirs having the turn tells them it lives (its lock, held through their
//! own description, is no conflict seen from there). They read through a read-only mapping of
//! their own where this process's mapping is private (a read-only handle's, copy-on-write):
//! pages it wrote into there, against the leaves' read-only flag, are its own, and would show
//! neither the writer's updates nor the sequence. Large copies run without the GIL. Nothing here
//! relies on the GIL, so a free-threaded build runs the same code: a snapshot claims kept memory
//! by taking it out of the tree's list under its lock (`snapshot::KeptSnapshots::claim`).

use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use dlpack_core::copy::cpu::{Run, Strided, copy_runs, copy_strided};
use dlpack_core::dtype::{DType, StoredType};
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;
use dlpack_core::share::lock::{WriteLock, write_locked};
use dlpack_core::share::seqlock::{Attempt, SeqLock};
use dlpack_core::share::tree::{self, HEADER, Header, Leaf, SEQUENCE_OFFSET, TreeLayout};
use dlpack_core::share::{ReadMapping, SealedFile, system};
use pyo3::exceptions::{PyBufferError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyTuple};

mod snapshot;

use super::lender;
use super::limits::explained;
use super::mapped::Mapped;
use super::pool::Reuse;
use super::state::{self, mapped_arc};
use super::views::{POPULATE_MIN_BYTES, nameable, segment_view, unnameable};
use crate::api::borrows;
use crate::copy;
use crate::error::{Error, Result};
use crate::object::{self, empty_view, tensor_of};
use crate::tensor::Tensor;
use dlpack_core::error::Error as CoreError;
use snapshot::{KeptSnapshots, Memory};

/// A pytree's segment as this process holds it: its mapping, layout, and what this process
/// may do with it.
#[pyclass(module = "dlpack.sharing", frozen)]
pub struct TreeSegment {
    mapped: Arc<Mapped>,
    /// A view of the segment's bytes from its start, whose handle pickles the tree.
    whole: Py<PyAny>,
    layout: TreeLayout,
    /// Each leaf's C-ordered layout (made once: snapshots make views of every leaf).
    c_layouts: Vec<Layout>,
    /// Whether this process may update it: its lender's, or a writable handle's receiver's.
    may_write: bool,
    /// Whether its pickles lend it writable.
    lends_writable: bool,
    /// Where a private mapping is read through instead (see the module's doc).
    reader: OnceLock<ReadMapping>,
    /// A description of the file of this process's own, where the mapped one was inherited
    /// through fork (whose locks are the parent's too).
    own: Mutex<Option<(i32, Arc<SealedFile>)>>,
    /// The leaves `open` gives (made once).
    leaves: PyOnceLock<Py<PyList>>,
    /// The last snapshots' memory and leaves, for the next ones once nothing else holds them.
    snapshots: KeptSnapshots,
}

impl TreeSegment {
    fn new(
        mapped: Arc<Mapped>,
        whole: Bound<'_, PyAny>,
        layout: TreeLayout,
        may_write: bool,
        lends_writable: bool,
        reader: OnceLock<ReadMapping>,
    ) -> Result<TreeSegment> {
        let c_layouts = layout
            .leaves()
            .iter()
            .map(|leaf| Layout::c_order(&leaf.shape, leaf.element.dtype.itemsize()))
            .collect::<dlpack_core::error::Result<_>>()?;
        let snapshots = KeptSnapshots::new(&layout);
        Ok(TreeSegment {
            mapped,
            whole: whole.unbind(),
            layout,
            c_layouts,
            may_write,
            lends_writable,
            reader,
            own: Mutex::new(None),
            leaves: PyOnceLock::new(),
            snapshots,
        })
    }
}

/// Register the class and its functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TreeSegment>()?;
    m.add_function(wrap_pyfunction!(_share_tree, m)?)?;
    let rebuild = wrap_pyfunction!(_share_tree_rebuild, m)?;
    m.add_function(rebuild.clone())?;
    let _ = REBUILD.set(m.py(), rebuild.into_any().unbind());
    Ok(())
}

/// The reconstructor segments pickle to, as the module holds it.
static REBUILD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// What `name(k)` calls leaf `k` (its path in the tree), for errors.
fn leaf_name(name: &Bound<'_, PyAny>, k: usize) -> String {
    name.call1((k,))
        .and_then(|named| named.extract::<String>())
        .unwrap_or_else(|_| format!("leaf {k}"))
}

/// The host memory a leaf is, checked to be shareable; `name` says where it is on error.
fn host_leaf(tensor: &Tensor, name: impl Fn() -> String) -> Result<Leaf> {
    let device = tensor.device().get()?;
    if !device.is_host() {
        return Err(Error::buffer(format!(
            "{} is in device memory ({}): a shared tree holds host memory; copy it there \
             first (e.g. tensor.cpu())",
            name(),
            device.name(),
        )));
    }
    if !nameable(tensor.dtype()) {
        return Err(Error::buffer(format!(
            "{}: {}",
            name(),
            unnameable(tensor.dtype()).message()
        )));
    }
    Ok(Leaf {
        element: StoredType {
            dtype: tensor.dtype(),
            swapped: tensor.swapped(),
        },
        shape: tensor.layout().shape().to_vec(),
    })
}

/// ``dlpack.share_tree``'s work: a new segment holding `leaves` (anything ``asdlpack`` reads, in
/// host memory) and `structure` (bytes), lent writable if `writable`. `name(k)` names leaf `k`
/// in errors.
#[pyfunction]
fn _share_tree<'py>(
    leaves: &Bound<'py, PyList>,
    structure: &Bound<'py, PyBytes>,
    writable: &Bound<'py, PyAny>,
    name: &Bound<'py, PyAny>,
) -> Result<Bound<'py, TreeSegment>> {
    let py = leaves.py();
    if !writable.is_exact_instance_of::<PyBool>() {
        return Err(Error::type_(format!(
            "writable must be True or False, not {}",
            writable.get_type().name()?
        )));
    }
    let writable = writable.is_truthy()?;
    let mut read = Vec::with_capacity(leaves.len());
    let mut specs = Vec::with_capacity(leaves.len());
    for (k, leaf) in leaves.iter().enumerate() {
        let as_read =
            object::read(&leaf).map_err(|err| named_error(py, err, || leaf_name(name, k)))?;
        specs.push(host_leaf(as_read.tensor(), || leaf_name(name, k))?);
        read.push(as_read);
    }
    let structure = structure.as_bytes();
    let layout = TreeLayout::plan(specs, structure.len() as u64)?;
    let size = layout.size();
    let mapped = segment_for(py, size).map_err(|err| explained(err, "share this tree"))?;
    let base = mapped.base_ptr();
    let (at, len) = layout.structure();
    debug_assert_eq!(len, structure.len() as u64);
    let table = layout.table();
    for (offset, bytes) in [(0, &layout.header()[..]), (HEADER, &table), (at, structure)] {
        let to = base.wrapping_add(offset as usize);
        // SAFETY: the header, table and structure lie in the segment's first `layout.size()`
        // bytes (the layout puts them there, before the leaves), which the mapping holds,
        // writable; nothing else can see the segment yet.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len()) };
    }
    let whole = whole_view(py, &mapped, size, writable)?;
    let segment = TreeSegment::new(mapped, whole, layout, true, writable, OnceLock::new())?;
    let mut staged = Vec::new();
    for (k, as_read) in read.iter().enumerate() {
        // Rows behind pointers (suboffsets) are gathered into memory of ours first.
        if as_read.tensor().indirect() {
            let copy = copy::to_c_order(py, as_read.tensor())
                .map_err(|err| named_error(py, err, || leaf_name(name, k)))?;
            staged.push((k, copy));
        }
    }
    let mut staged = staged.iter().peekable();
    let sources =
        read.iter()
            .enumerate()
            .map(|(k, as_read)| match staged.next_if(|(at, _)| *at == k) {
                Some((_, copy)) => copy,
                None => as_read.tensor(),
            });
    let copies = segment.leaf_copies(sources);
    if segment.layout.data().1 < DETACH_MIN_BYTES {
        // SAFETY: `leaf_copies` made the copies from the layout of the segment, which nothing
        // else can see yet, and from the sources' own layouts (host memory, checked by
        // `host_leaf`, live while `read` and `staged` hold them, which share no byte with a
        // segment no process maps).
        unsafe { copies.run() };
    } else {
        // SAFETY: the targets are the leaves' places in a segment nothing else can see yet;
        // the sources are host memory (`host_leaf`) sharing no byte with a segment no process
        // maps, held by their exports (`read`) or ours (`staged`), so nothing frees or moves
        // them while the GIL is released.
        py.detach(move || unsafe { copies.run() });
    }
    Ok(Bound::new(py, segment)?)
}

/// Copies of at least this many bytes in all are made without the GIL (below it, releasing
/// and retaking it costs more than the copy).
const DETACH_MIN_BYTES: u64 = 64 << 10;

/// One leaf's copy through the copy engine (a leaf not contiguous in the tree's byte order).
struct StridedCopy {
    to: Strided,
    from: Strided,
    itemsize: usize,
    swap: Option<usize>,
}

/// A tree's leaf copies, run together (without the GIL where they are large): the contiguous
/// leaves in the tree's byte order as one batch, which chooses threads and stores on the
/// batch's total bytes as one copy of that size would (a leaf of a few MiB alone would take
/// one thread and ordinary stores), the others one by one through the copy engine.
struct LeafCopies {
    runs: Vec<Run>,
    strided: Vec<StridedCopy>,
}

// SAFETY: the copies only carry addresses of memory their maker keeps alive for as long as
// they run (see `LeafCopies::run`); running them reads the sources and writes the segment,
// from whichever thread.
unsafe impl Send for LeafCopies {}

impl LeafCopies {
    /// Run every copy.
    ///
    /// # Safety
    /// Every copy's target is writable for the call, and read or written by no one else
    /// meanwhile (but readers through the sequence lock, who throw away what they read during
    /// a write); every source is readable for the call and shares no byte with any target;
    /// no two targets share a byte.
    unsafe fn run(&self) {
        // SAFETY: the contract; each run is a leaf's size on each side.
        unsafe { copy_runs(&self.runs) };
        for copy in &self.strided {
            // SAFETY: the contract; both layouts address the leaf's elements.
            unsafe { copy_strided(&copy.to, &copy.from, copy.itemsize, copy.swap) }
        }
    }
}

/// A segment of `size` bytes for a tree: one kept from an earlier tree of this size that no
/// process maps any more, or a new one.
fn segment_for(py: Python<'_>, size: u64) -> Result<Arc<Mapped>> {
    // Segments whose handles were released since the lender last looked may be reused now.
    lender::sweep();
    if let Some(mapped) = Mapped::reuse(size, Reuse::Tree)? {
        return Ok(mapped);
    }
    let mapped = Mapped::create(size, Some(Reuse::Tree))?;
    if size >= POPULATE_MIN_BYTES {
        py.detach(|| mapped.populate(size as usize))?;
    }
    Ok(mapped)
}

/// `err` with `name()` before its message, where it says why a leaf can't be read or written:
/// one of ours, or a BufferError, TypeError or ValueError a library raised reading it (made
/// anew, of its type, the library's own its cause); anything else as it is.
fn named_error(py: Python<'_>, err: Error, name: impl Fn() -> String) -> Error {
    match err {
        Error::Core(core) => {
            let message = format!("{}: {}", name(), core.message());
            Error::Core(match core {
                CoreError::Buffer(_) => CoreError::Buffer(message),
                CoreError::Type(_) => CoreError::Type(message),
                CoreError::Value(_) => CoreError::Value(message),
                other => other,
            })
        }
        Error::Python(raised) => {
            let kind = raised.get_type(py);
            let said = [
                py.get_type::<PyBufferError>(),
                py.get_type::<PyTypeError>(),
                py.get_type::<PyValueError>(),
            ];
            if !said.iter().any(|said| kind.is(said)) {
                return Error::Python(raised);
            }
            let named = PyErr::from_type(kind, format!("{}: {}", name(), raised.value(py)));
            named.set_cause(py, Some(raised));
            Error::Python(named)
        }
    }
}

/// The view of the segment's first `size` bytes that its handle names.
fn whole_view<'py>(
    py: Python<'py>,
    mapped: &Arc<Mapped>,
    size: u64,
    writable: bool,
) -> Result<Bound<'py, PyAny>> {
    let element = StoredType {
        dtype: DType::from_name("uint8").expect("a named type"),
        swapped: false,
    };
    let layout = Layout::c_order(&[size as i64], 1)?;
    segment_view(py, mapped.clone(), 0, element, layout, !writable)
}

/// Unpickle a tree's segment: its handle opened, its header and table read and checked.
#[pyfunction]
fn _share_tree_rebuild<'py>(state: &Bound<'py, PyAny>) -> Result<Bound<'py, TreeSegment>> {
    let py = state.py();
    let (whole, writable) = state::open(state)?;
    let tensor = tensor_of(&whole).ok_or_else(|| tree::malformed("its view is not one"))?;
    let mapped = mapped_arc(tensor).ok_or_else(|| tree::malformed("it names no memory"))?;
    let view_len = tensor.layout().shape().first().copied().unwrap_or(0);
    let at_start = std::ptr::eq(tensor.data().cast::<u8>(), mapped.base_ptr());
    if !at_start || tensor.layout().ndim() != 1 || tensor.dtype().itemsize() != 1 {
        return Err(
            tree::malformed("its handle does not name the segment's bytes from its start").into(),
        );
    }
    let capacity = (view_len as u64).min(mapped.segment().capacity());
    if capacity < HEADER {
        return Err(tree::malformed("its segment is too small").into());
    }
    let reader = OnceLock::new();
    let base = if mapped.is_private() {
        let made = ReadMapping::new(mapped.segment().files().file())?;
        reader.get_or_init(|| made).as_ptr()
    } else {
        mapped.base_ptr().cast_const()
    };
    // SAFETY: the segment's first HEADER bytes (checked to hold that many), readable through
    // `base` while `mapped` and `reader` are held; copied out before they are checked.
    let header = unsafe { read_bytes(base, 0, HEADER) }?;
    let header = Header::decode(header.as_slice().try_into().expect("HEADER bytes"))?;
    if header.table_len > capacity - HEADER {
        return Err(tree::malformed("its table runs past its segment").into());
    }
    // SAFETY: `table_len` bytes from HEADER lie in the segment (checked just above), readable
    // through `base`.
    let table = unsafe { read_bytes(base, HEADER, header.table_len) }?;
    let layout = TreeLayout::decode(&header, &table, capacity)?;
    let may_write = writable && !mapped.is_private();
    let segment = TreeSegment::new(mapped, whole, layout, may_write, writable, reader)?;
    Ok(Bound::new(py, segment)?)
}

/// A shape as Python spells it: `(2, 3)`, `(4,)`, `()`.
fn shape_text(shape: &[i64]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => {
            let extents: Vec<String> = shape.iter().map(i64::to_string).collect();
            format!("({})", extents.join(", "))
        }
    }
}

/// The `len` bytes `at` bytes from `base`, copied out (a MemoryError where the copy can't be
/// had: a table or structure as long as the segment says it is).
///
/// # Safety
/// Those bytes are readable memory.
unsafe fn read_bytes(base: *const u8, at: u64, len: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| Error::Core(CoreError::memory(format!("can't copy {len} bytes out"))))?;
    let from = base.wrapping_add(at as usize);
    // SAFETY: `from` is `len` readable bytes (the contract), copied into `bytes`' spare
    // capacity, `len` bytes reserved just above, which then hold them.
    unsafe {
        std::ptr::copy_nonoverlapping(from, bytes.as_mut_ptr(), len as usize);
    }
    // SAFETY: the first `len` bytes were just written.
    unsafe { bytes.set_len(len as usize) };
    Ok(bytes)
}

impl TreeSegment {
    /// Where this process reads the segment: its shared mapping, or a read-only mapping of its
    /// own where that one is private.
    fn source(&self) -> Result<*const u8> {
        if !self.mapped.is_private() {
            return Ok(self.mapped.base_ptr());
        }
        if let Some(reader) = self.reader.get() {
            return Ok(reader.as_ptr());
        }
        let made = ReadMapping::new(self.mapped.segment().files().file())?;
        Ok(self.reader.get_or_init(|| made).as_ptr())
    }

    /// The sequence word, as this process reads (or, a writer, writes) it.
    fn sequence(&self) -> Result<&AtomicU64> {
        if !self.mapped.is_private() {
            return Ok(self.mapped.mapping().atomic_word(SEQUENCE_OFFSET));
        }
        self.source()?;
        let reader = self.reader.get().expect("made by source");
        Ok(reader.atomic_word(SEQUENCE_OFFSET))
    }

    /// A description of the segment's file of this process's own (for the writers' lock),
    /// writable if the mapped one is.
    fn own_file(&self) -> Result<Arc<SealedFile>> {
        let files = self.mapped.segment().files();
        let pid = system::pid();
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((opened_by, file)) = &*own
            && *opened_by == pid
        {
            return Ok(file.clone());
        }
        let file = Arc::new(files.file().reopen(files.file().writable())?);
        *own = Some((pid, file.clone()));
        Ok(file)
    }

    /// Run `with` with the descriptor whose locks are this process's own.
    fn with_own_fd<T>(&self, with: impl FnOnce(BorrowedFd<'_>) -> Result<T>) -> Result<T> {
        let files = self.mapped.segment().files();
        if files.opened_here() {
            return with(files.file().fd());
        }
        let own = self.own_file()?;
        with(own.fd())
    }

    /// The error of reading while a writer that is gone left its write half done.
    fn torn(&self, odd: u64) -> Error {
        Error::buffer(format!(
            "this tree's update to generation {} was cut short: its writer exited while \
             writing, so its memory holds parts of two generations, and no consistent snapshot \
             can be had until it is updated again",
            dlpack_core::share::seqlock::generation(odd + 1)
        ))
    }

    /// Copy the leaves, all of one generation, into `buffer` (the data's length, claimed by
    /// this snapshot): that generation. Waits for a write under way (`timeout` seconds at most,
    /// None: while its writer lives); a write whose writer died halfway is a BufferError.
    pub(super) fn copy_out(
        &self,
        py: Python<'_>,
        buffer: &AlignedBuffer,
        timeout: Option<f64>,
    ) -> Result<u64> {
        let (data, len) = self.layout.data();
        let len = len as usize;
        let from = self.source()?.wrapping_add(data as usize) as usize;
        let to = buffer.as_ptr() as usize;
        let sequence = SeqLock::new(self.sequence()?);
        let copy = move || {
            let to = Strided {
                ptr: to as *mut u8,
                shape: vec![len],
                strides: vec![1],
            };
            let from = Strided {
                ptr: from as *mut u8,
                shape: vec![len],
                strides: vec![1],
            };
            // SAFETY: `from` is the segment's leaves, `len` bytes from `data`, inside the
            // segment (`TreeLayout::decode` checked it holds them), readable while `self` holds
            // its mapping; `to` is the buffer of `len` bytes, which this snapshot claimed: no
            // view, export or other snapshot reaches it. Writers (of this process or another)
            // may write the leaves meanwhile: a copy that overlapped a write is thrown away, as
            // the sequence tells.
            unsafe { copy_strided(&to, &from, 1, None) }
        };
        let started = Instant::now();
        let mut rounds = 0u32;
        let mut nap = Duration::from_micros(10);
        loop {
            // Large copies are made without the GIL; a write under way is seen holding it.
            let attempt = if (len as u64) < DETACH_MIN_BYTES || sequence.load() & 1 == 1 {
                sequence.try_read(copy)
            } else {
                py.detach(|| sequence.try_read(copy))
            };
            let odd = match attempt {
                Attempt::Read { generation, .. } => return Ok(generation),
                Attempt::Changed => None,
                Attempt::Writing(odd) => Some(odd),
            };
            rounds += 1;
            if let Some(deadline) = timeout
                && started.elapsed().as_secs_f64() >= deadline
            {
                let why = if odd.is_some() {
                    "a writer is still writing it"
                } else {
                    "updates kept landing while it was copied"
                };
                return Err(PyTimeoutError::new_err(format!(
                    "no consistent snapshot of this tree within {deadline} s: {why}"
                ))
                .into());
            }
            let Some(odd) = odd else { continue };
            if rounds < SPINS {
                std::hint::spin_loop();
                continue;
            }
            // Now and then (each doubling of the rounds), whether the writer lives: a thread of
            // this process has the writers' turn while it writes (the writers' lock, which it
            // holds through this process's description, is no conflict seen from here).
            if rounds.is_power_of_two() && !self.mapped.writers().busy() {
                let gone = self.with_own_fd(|fd| Ok(!write_locked(fd)?))?;
                if gone && sequence.load() == odd {
                    return Err(self.torn(odd));
                }
            }
            py.detach(|| std::thread::sleep(nap));
            nap = (nap * 2).min(MAX_NAP);
        }
    }

    /// The copies of `sources` (one per leaf, of its shape and element type, in host memory)
    /// into the leaves' places in this process's shared mapping: each leaf C-ordered, in the
    /// tree's byte order.
    fn leaf_copies<'t>(&self, sources: impl Iterator<Item = &'t Tensor>) -> LeafCopies {
        let base = self.mapped.base_ptr();
        let leaves = self.layout.leaves().iter().zip(self.layout.placed());
        let (mut runs, mut strided) = (Vec::with_capacity(self.layout.leaves().len()), Vec::new());
        for (source, ((leaf, placed), c_layout)) in sources.zip(leaves.zip(&self.c_layouts)) {
            if placed.nbytes == 0 {
                continue;
            }
            let to = base.wrapping_add(placed.offset as usize);
            let swap =
                (leaf.element.swapped != source.swapped()).then(|| leaf.element.dtype.swap_unit());
            let contiguous = source.layout().is_c_contiguous() && !source.indirect();
            if swap.is_none() && contiguous {
                runs.push(Run {
                    dst: to,
                    src: source.data().cast_const().cast(),
                    len: placed.nbytes as usize,
                });
                continue;
            }
            let strides = |layout: &Layout| -> Vec<isize> {
                layout.byte_strides().iter().map(|&s| s as isize).collect()
            };
            let shape: Vec<usize> = leaf.shape.iter().map(|&n| n as usize).collect();
            strided.push(StridedCopy {
                to: Strided {
                    ptr: to,
                    shape: shape.clone(),
                    strides: strides(c_layout),
                },
                from: Strided {
                    ptr: source.data().cast(),
                    shape,
                    strides: strides(source.layout()),
                },
                itemsize: leaf.element.dtype.itemsize(),
                swap,
            });
        }
        LeafCopies { runs, strided }
    }

    /// Leaf `k`'s element type and shape as its layout holds them.
    fn check_leaf(&self, k: usize, tensor: &Tensor, name: &Bound<'_, PyAny>) -> Result<()> {
        let leaf = &self.layout.leaves()[k];
        let device = tensor.device().get()?;
        if !device.is_host() {
            host_leaf(tensor, || leaf_name(name, k))?;
        }
        if tensor.dtype() != leaf.element.dtype {
            return Err(Error::type_(format!(
                "{} holds {}, but the tree was shared with {} there: an update keeps every \
                 leaf's type",
                leaf_name(name, k),
                tensor.dtype().name(),
                leaf.element.dtype.name()
            )));
        }
        if tensor.layout().shape() != leaf.shape.as_slice() {
            return Err(Error::value(format!(
                "{} has shape {}, but the tree was shared with shape {} there: an update keeps \
                 every leaf's shape",
                leaf_name(name, k),
                shape_text(tensor.layout().shape()),
                shape_text(&leaf.shape)
            )));
        }
        Ok(())
    }
}

/// How long a reader spins before it sleeps, and how often it asks whether a writer lives.
const SPINS: u32 = 64;
const MAX_NAP: Duration = Duration::from_millis(1);

#[pymethods]
impl TreeSegment {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Err(PyTypeError::new_err(
            "TreeSegment objects are made by dlpack.share_tree()",
        ))
    }

    /// The tree's structure, as ``share_tree`` wrote it.
    fn structure<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyBytes>> {
        let (at, len) = self.layout.structure();
        let base = self.source()?;
        // SAFETY: the structure's bytes lie in the segment's first `layout.size()` bytes
        // (`TreeLayout::decode` checked its size against the segment), readable through `base`.
        let bytes = unsafe { read_bytes(base, at, len) }?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The leaves over the segment's memory, read-only (made once).
    fn leaves<'py>(&self, py: Python<'py>) -> Result<Bound<'py, PyList>> {
        if let Some(leaves) = self.leaves.get(py) {
            return Ok(leaves.bind(py).clone());
        }
        let list = PyList::empty(py);
        let leaves = self.layout.leaves().iter().zip(self.layout.placed());
        for ((leaf, placed), layout) in leaves.zip(&self.c_layouts) {
            let layout = layout.clone();
            let view = if placed.nbytes == 0 {
                empty_view(py, leaf.element, layout, true)?
            } else {
                let offset = placed.offset as i64;
                segment_view(py, self.mapped.clone(), offset, leaf.element, layout, true)?
            };
            list.append(view)?;
        }
        let _ = self.leaves.set(py, list.clone().unbind());
        Ok(self
            .leaves
            .get(py)
            .expect("set just above")
            .bind(py)
            .clone())
    }

    /// Write `leaves` (as many as the tree's, each of the same type and shape as the tree's
    /// there) as the next generation; `name(k)` names leaf `k` in errors. Waits for another
    /// write under way, another process's or thread's (`timeout` seconds at most, None: while
    /// its writer lives).
    #[pyo3(signature = (leaves, name, timeout=None))]
    fn update(
        &self,
        py: Python<'_>,
        leaves: &Bound<'_, PyList>,
        name: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> Result<u64> {
        if !self.may_write {
            return Err(Error::value(
                "this tree was shared read-only: only its lender, or a process it was shared \
                 with writable (share_tree(tree, writable=True)), can update it",
            ));
        }
        let count = self.layout.leaves().len();
        if leaves.len() != count {
            return Err(Error::value(format!(
                "the tree has {} array leaves, but was shared with {count}: an update keeps the \
                 tree's structure",
                leaves.len()
            )));
        }
        let (low, high) = (
            self.mapped.base_ptr() as usize,
            self.mapped.base_ptr() as usize + self.layout.size() as usize,
        );
        let mut sources = Vec::with_capacity(count);
        for (k, leaf) in leaves.iter().enumerate() {
            let read =
                object::read(&leaf).map_err(|err| named_error(py, err, || leaf_name(name, k)))?;
            let tensor = read.tensor();
            self.check_leaf(k, tensor, name)?;
            // Memory in the segment itself (its leaves, in another order) or behind suboffsets
            // is copied out first: the writes would change it before it is read.
            let (start, end) = borrows::range_of(tensor)?;
            let inside = start < high && low < end && start < end;
            let staged = if inside || tensor.indirect() {
                Some(copy::to_c_order(py, tensor)?)
            } else {
                None
            };
            sources.push((read, staged));
        }
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let timed_out = |who: &str| -> Error {
            PyTimeoutError::new_err(format!(
                "{who} is updating this tree, and did not finish within {} s",
                timeout.unwrap_or_default()
            ))
            .into()
        };
        // This process's threads share the writers' lock (it is the process's description's):
        // they take turns first, waiting without the GIL, which the thread writing may need.
        let writers = self.mapped.writers();
        let turn = match writers.try_turn() {
            Some(turn) => turn,
            None => py
                .detach(|| writers.turn(deadline))
                .ok_or_else(|| timed_out("another thread of this process"))?,
        };
        // A view another extension holds of the leaves must not see them change, nor one be
        // taken while they do: the leaves are held as written until `update` returns.
        let (data, data_len) = self.layout.data();
        let _writing = borrows::Writing::take(
            low + data as usize,
            low + (data + data_len) as usize,
            "SharedTree.update",
        )?;
        self.with_own_fd(|fd| {
            let mut nap = Duration::from_micros(20);
            let lock = loop {
                if let Some(lock) = WriteLock::try_take(fd)? {
                    break lock;
                }
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    return Err(timed_out("another process"));
                }
                py.detach(|| std::thread::sleep(nap));
                nap = (nap * 2).min(MAX_NAP * 10);
            };
            let sequence = SeqLock::new(self.mapped.mapping().atomic_word(SEQUENCE_OFFSET));
            let writing = sequence.begin_write(&lock.exclusive(&turn));
            let sources = sources
                .iter()
                .map(|(read, staged)| staged.as_ref().unwrap_or_else(|| read.tensor()));
            let copies = self.leaf_copies(sources);
            // SAFETY: the copies' targets are the leaves' places in the segment, writable
            // through this process's shared mapping (`may_write`), which `self` holds; their
            // sources are host memory (checked by `check_leaf`), held by their exports
            // (`sources`) until this returns, sharing no byte with the segment (a source that
            // did was staged into memory of ours). No other writer writes meanwhile: the
            // writers' lock keeps other processes' out, the turn this process's other threads;
            // readers, here or elsewhere, read only through the sequence lock, and views of the
            // leaves through the C API are refused while `_writing` holds them.
            let run = move || unsafe { copies.run() };
            if data_len < DETACH_MIN_BYTES {
                run();
            } else {
                py.detach(run);
            }
            Ok(writing.end())
        })
    }

    /// A copy of every leaf, all of one generation, and that generation: `(leaves,
    /// generation)`. Waits for a write under way (`timeout` seconds at most, None: while its
    /// writer lives); a write whose writer died halfway is a BufferError.
    /// With `keys` (a state dict's, as many as the leaves) the leaves come as a dict of those
    /// keys in order instead of a list: the dict an earlier snapshot handed out, where nothing
    /// holds or changed it any more.
    #[pyo3(signature = (timeout=None, keys=None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        keys: Option<&Bound<'py, PyTuple>>,
    ) -> Result<(Bound<'py, PyAny>, u64)> {
        let len = self.layout.data().1;
        if let Some(keys) = keys
            && keys.len() != self.layout.leaves().len()
        {
            return Err(Error::value(format!(
                "{} keys for a tree of {} array leaves",
                keys.len(),
                self.layout.leaves().len()
            )));
        }
        let memory = self.snapshots.claim(py, len as usize)?;
        let generation = match self.copy_out(py, memory.buffer(), timeout) {
            Ok(generation) => generation,
            Err(err) => {
                if let Memory::Kept(kept) = memory {
                    self.snapshots.keep(kept);
                }
                return Err(err);
            }
        };
        let mut kept = memory.into_kept(py, &self.layout, &self.c_layouts)?;
        let handed = kept.hand_out(py, keys);
        self.snapshots.keep(kept);
        Ok((handed?, generation))
    }

    /// The generation the tree holds: the number of updates ended (one under way not yet).
    #[getter]
    fn generation(&self) -> Result<u64> {
        Ok(dlpack_core::share::seqlock::generation(
            SeqLock::new(self.sequence()?).load(),
        ))
    }

    /// The sequence word as it is (for tests: odd while a write is under way).
    #[getter]
    fn _sequence(&self) -> Result<u64> {
        Ok(SeqLock::new(self.sequence()?).load())
    }

    /// Whether a thread of this process has the writers' turn (for tests: it is updating, or
    /// waiting for another process's update to end).
    #[getter]
    fn _updating_here(&self) -> bool {
        self.mapped.writers().busy()
    }

    /// Whether this process may update the tree.
    #[getter]
    fn writable(&self) -> bool {
        self.may_write
    }

    /// Whether pickles of it lend it writable.
    #[getter]
    fn lends_writable(&self) -> bool {
        self.lends_writable
    }

    /// Bytes of its leaves' elements (alignment between them left out).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.layout
            .placed()
            .iter()
            .map(|placed| placed.nbytes)
            .sum()
    }

    /// How many array leaves it holds.
    fn __len__(&self) -> usize {
        self.layout.leaves().len()
    }

    /// The memory it lies in (for tests): `((device, inode), size)` of its segment.
    #[getter]
    fn _memory(&self) -> ((u64, u64), u64) {
        let segment = self.mapped.segment();
        let id = segment.id();
        ((id.dev, id.ino), segment.size())
    }

    /// Pickle: the handle of the segment (pinned for the receiver in this process's lender).
    fn __reduce__<'py>(&self, py: Python<'py>) -> Result<(Py<PyAny>, (Bound<'py, PyBytes>,))> {
        let rebuild = REBUILD
            .get(py)
            .expect("registered with the class")
            .clone_ref(py);
        let state = state::write(self.whole.bind(py), self.lends_writable)
            .map_err(|err| explained(err, "pickle this tree"))?;
        Ok((rebuild, (state,)))
    }
}
