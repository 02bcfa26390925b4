//! `import`: which protocol an object is read through (see the module's doc for the order), and
//! what a type's exports mean (immutable JAX arrays, masked numpy arrays, torch's flags).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::{array_interface, arrow, buffer, cuda_array_interface, dlpack, numpy, protocols};
use crate::error::{Error, Result};
use crate::ffi::arrow::Method;
use crate::tensor::Tensor;

/// What `asdlpack` imported, and the DLPack producer to ask again when a consumer names a
/// stream (device data only).
pub struct Imported {
    pub tensor: Tensor,
    pub producer: Option<Py<PyAny>>,
}

/// `import` for the commonest case, when it needs no Python code: an exact numpy array of a
/// dtype seen last time, written into `dst` (see `numpy::import_known_into`). False otherwise
/// (`dst` untouched; `import` then says what it is, or what is wrong).
///
/// # Safety
/// `dst` is valid for writes of a `Tensor`.
#[inline(always)]
pub unsafe fn import_known_into(obj: &Bound<'_, PyAny>, dst: *mut Tensor) -> bool {
    let Some(array) = numpy::ExactNdarray::new(obj) else {
        return false;
    };
    // SAFETY: `dst` is valid for writes of a `Tensor` (this function's contract), which is all
    // `numpy::import_known_into` asks.
    unsafe { numpy::import_known_into(array, dst) }
}

/// Whether `obj` is an array its library keeps immutable (JAX), whatever its exports say.
pub fn is_immutable(obj: &Bound<'_, PyAny>) -> bool {
    protocols::of_type(&obj.get_type()).immutable
}

pub fn import(obj: &Bound<'_, PyAny>) -> Result<Imported> {
    import_with(obj, true)
}

/// `import` of the memory itself, never a copy a producer substitutes: C exchange APIs may hand
/// over a copy of read-only memory (ours does, see `object::exchange_api`), so only torch's
/// (which exports the tensor's own memory) is used. For callers that write through what they
/// import, or report its flags.
pub fn import_in_place(obj: &Bound<'_, PyAny>) -> Result<Imported> {
    import_with(obj, false)
}

/// The ways `asdlpack` reads an object's memory, and the checks made on the way, in the one
/// list below, which makes the `Step` enum, `ORDER`, each step's protocol name and function, and
/// `walk`, which takes the steps in that order written out one after another (so that each call
/// goes straight into its step: a loop calling one function per step cost a tenth of an
/// import). The first protocol the object speaks decides, except that a `BufferError` from the
/// object's own `__dlpack__` lets the protocols after it have their turn (and explains best if
/// none serves). `docs/guide/any-array.md` states this order; `make docs` holds the two together.
macro_rules! steps {
    ($($(#[doc = $doc:literal])* $step:ident: $protocol:expr => $try:ident;)+) => {
        /// A step of the import (see `steps!`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Step {
            $($(#[doc = $doc])* $step,)+
        }

        /// The steps, first to last.
        pub const ORDER: [Step; [$(Step::$step),+].len()] = [$(Step::$step),+];

        impl Step {
            /// The protocol's name as the guide spells it; `None` for a check that reads
            /// nothing.
            pub fn protocol(self) -> Option<&'static str> {
                match self {
                    $(Step::$step => $protocol,)+
                }
            }
        }

        /// Take the steps in `ORDER` until one reads the memory or ends the search.
        #[inline(always)]
        fn walk(cx: &Probe<'_, '_>) -> Result<Imported> {
            // `__dlpack__`'s own BufferError, kept while the protocols after it are tried.
            let mut refused: Option<Error> = None;
            $(
                match $try(cx) {
                    Ok(Some(imported)) => return Ok(cx.finish(imported)),
                    Ok(None) => {}
                    Err(Stop::Refused(err)) => refused = Some(err),
                    // The producer's own refusal explains best what is wrong.
                    Err(Stop::Failed(err)) => return Err(refused.unwrap_or(err)),
                }
            )+
            Err(refused.unwrap_or_else(|| unsupported(cx.obj)))
        }
    };
}

steps! {
    /// An exact numpy array, read from its C struct (numpy's array interface, without Python).
    NumpyStruct: Some("numpy's array struct") => try_numpy_struct;
    /// A raw Arrow stream capsule (`"arrow_array_stream"`, or the device variant).
    ArrowStreamCapsule: Some("Arrow stream capsule") => try_arrow_stream_capsule;
    /// A raw DLPack capsule (`"dltensor"`, `"dltensor_versioned"`).
    DlpackCapsule: Some("DLPack capsule") => try_dlpack_capsule;
    /// Quirk: a numpy masked array with masked elements is refused (its exports drop the mask).
    RefuseMaskedElements: None => try_masked_elements;
    /// The DLPack C exchange API of the object's type (`__dlpack_c_exchange_api__`): any type's
    /// for `asdlpack`, only torch's where the memory itself is needed (see `import_in_place`);
    /// quirk: torch's only for tensors it exports faithfully (no conjugate or negative bit, not
    /// requiring grad).
    ExchangeApi: Some("DLPack C exchange API") => try_exchange_api;
    /// `__dlpack__`; quirks: a torch nested tensor's refusal is named, and an Arrow object's
    /// refusal (of whatever type) hands it to the Arrow interface.
    Dlpack: Some("__dlpack__") => try_dlpack;
    CudaArrayInterface: Some("__cuda_array_interface__") => try_cuda_array_interface;
    ArrayStruct: Some("__array_struct__") => try_array_struct;
    ArrayInterface: Some("__array_interface__") => try_array_interface;
    /// The Arrow PyCapsule interface (`__arrow_c_device_array__`, `__arrow_c_device_stream__`,
    /// `__arrow_c_array__`, `__arrow_c_stream__`): after the array interface, since an object
    /// with both (a Pillow image) describes its shape there, its Arrow export being a flat
    /// column of pixels.
    Arrow: Some("Arrow PyCapsule interface") => try_arrow;
    Buffer: Some("buffer protocol") => try_buffer;
    /// numpy's `__array__(copy=False)`, the last resort.
    NumpyArray: Some("__array__") => try_numpy_array;
}

/// What a step gives: the memory read, nothing (the object doesn't speak it), or why it stops.
type Found = std::result::Result<Option<Imported>, Stop>;

fn found(tensor: Tensor) -> Found {
    Ok(Some(Imported::of(tensor)))
}

/// `Step::NumpyStruct`: without the per-type lookup when numpy's type is known; else the first
/// array of the process, whose type the lookup just found to be numpy's.
fn try_numpy_struct(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    let array = numpy::ExactNdarray::new(obj).or_else(|| {
        cx.protocols()
            .ndarray
            .then(|| numpy::ExactNdarray::new(obj))?
    });
    match array {
        Some(array) => Ok(numpy::import(array)?.map(Imported::of)),
        None => Ok(None),
    }
}

/// `Step::ArrowStreamCapsule`.
fn try_arrow_stream_capsule(cx: &Probe<'_, '_>) -> Found {
    match arrow::stream_capsule_kind(cx.obj) {
        Some(kind) => found(arrow::import_stream(cx.obj, kind)?),
        None => Ok(None),
    }
}

/// `Step::DlpackCapsule`.
fn try_dlpack_capsule(cx: &Probe<'_, '_>) -> Found {
    match dlpack::is_capsule(cx.obj) {
        true => found(dlpack::import_capsule(cx.obj)?),
        false => Ok(None),
    }
}

/// `Step::RefuseMaskedElements`.
fn try_masked_elements(cx: &Probe<'_, '_>) -> Found {
    if cx.protocols().numpy_masked {
        refuse_masked_elements(cx.obj)?;
    }
    Ok(None)
}

/// `Step::ExchangeApi`.
fn try_exchange_api(cx: &Probe<'_, '_>) -> Found {
    let (obj, protocols) = (cx.obj, cx.protocols());
    let Some(table) = protocols.exchange_api else {
        return Ok(None);
    };
    if !(cx.any_exchange_api || protocols.torch)
        || (protocols.torch && !torch_exports_faithfully(obj)?)
    {
        return Ok(None);
    }
    // SAFETY: `protocols` are those of `obj`'s type, so `table` is its exchange API.
    Ok(unsafe { dlpack::import_exchange_api(obj, table) }.map(Imported::of))
}

/// `Step::Dlpack`.
fn try_dlpack(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    let Some(method) = cx.attr(intern!(py, "__dlpack__"), cx.protocols().dlpack)? else {
        return Ok(None);
    };
    match dlpack::import_producer(&method, None) {
        Ok(tensor) => {
            let on_device = !matches!(tensor.device().get(), Ok(d) if d.is_host());
            let producer = on_device.then(|| obj.clone().unbind());
            Ok(Some(Imported { tensor, producer }))
        }
        Err(_) if cx.protocols().torch && is_nested(obj) => Err(nested_tensor().into()),
        Err(_) if cx.protocols().arrow => match try_arrow(cx)? {
            Some(imported) => Ok(Some(imported)),
            None => Err(Error::type_("the Arrow interface went away").into()),
        },
        Err(err) if err.is_buffer_error(py) => Err(Stop::Refused(err)),
        Err(err) => Err(err.into()),
    }
}

/// `Step::CudaArrayInterface`.
fn try_cuda_array_interface(cx: &Probe<'_, '_>) -> Found {
    let declared = cx.protocols().cuda_array_interface;
    match cx.attr(intern!(cx.obj.py(), "__cuda_array_interface__"), declared)? {
        Some(cai) => found(cuda_array_interface::import(cx.obj, cai)?),
        None => Ok(None),
    }
}

/// `Step::ArrayStruct`.
fn try_array_struct(cx: &Probe<'_, '_>) -> Found {
    let declared = cx.protocols().array_struct;
    match cx.attr(intern!(cx.obj.py(), "__array_struct__"), declared)? {
        Some(capsule) => found(array_interface::import_struct(cx.obj, capsule)?),
        None => Ok(None),
    }
}

/// `Step::ArrayInterface`.
fn try_array_interface(cx: &Probe<'_, '_>) -> Found {
    let declared = cx.protocols().array_interface;
    match cx.attr(intern!(cx.obj.py(), "__array_interface__"), declared)? {
        Some(interface) => found(array_interface::import(cx.obj, interface)?),
        None => Ok(None),
    }
}

/// `Step::Arrow`: the interface's methods in `Method::ALL`'s order.
fn try_arrow(cx: &Probe<'_, '_>) -> Found {
    let py = cx.obj.py();
    for method in Method::ALL {
        let declared = cx.protocols().arrow_methods[method as usize];
        if let Some(bound) = cx.attr(protocols::arrow_name(py, method), declared)? {
            return found(arrow::import_method(&bound, method)?);
        }
    }
    Ok(None)
}

/// `Step::Buffer`.
fn try_buffer(cx: &Probe<'_, '_>) -> Found {
    match buffer::supports(cx.obj) {
        true => found(buffer::import(cx.obj)?),
        false => Ok(None),
    }
}

/// `Step::NumpyArray`.
fn try_numpy_array(cx: &Probe<'_, '_>) -> Found {
    let declared = cx.protocols().numpy_array;
    match cx.attr(intern!(cx.obj.py(), "__array__"), declared)? {
        Some(method) => found(numpy_array_of(cx.obj, &method)?),
        None => Ok(None),
    }
}

/// Why a step stopped short of reading the memory.
enum Stop {
    /// `__dlpack__` refused it with a `BufferError`: the protocols after it get their turn, and
    /// this explains best if none serves.
    Refused(Error),
    /// Anything else: the search ends here.
    Failed(Error),
}

impl From<Error> for Stop {
    #[cold]
    fn from(err: Error) -> Stop {
        Stop::Failed(err)
    }
}

impl From<PyErr> for Stop {
    #[cold]
    fn from(err: PyErr) -> Stop {
        Stop::Failed(err.into())
    }
}

impl Imported {
    fn of(tensor: Tensor) -> Imported {
        Imported {
            tensor,
            producer: None,
        }
    }
}

/// What the steps ask of the object, found once: its type's protocols (looked up on first
/// need, since the first steps need none).
struct Probe<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    any_exchange_api: bool,
    protocols: std::cell::OnceCell<protocols::Protocols>,
}

impl<'py> Probe<'_, 'py> {
    /// What a step read, as `asdlpack` hands it on: lent on to consumers that may write (the
    /// buffer protocol, the array interface), an immutable array's memory must say it is
    /// read-only, whatever its exports say. Only a type looked up can be immutable: the steps
    /// that read without the lookup take exact numpy arrays and capsules, which are not.
    #[inline(always)]
    fn finish(&self, mut imported: Imported) -> Imported {
        if self.protocols.get().is_some_and(|p| p.immutable) {
            imported.tensor.make_readonly();
        }
        imported
    }

    #[inline(always)]
    fn protocols(&self) -> &protocols::Protocols {
        self.protocols
            .get_or_init(|| protocols::of_type(&self.obj.get_type()))
    }

    /// The attribute `name`, where it may exist: on the type when it declares it, or on the
    /// instance when the type's attributes or the instance's may change. Quirk: a type that
    /// declares the Arrow interface is served through what it declares, and its instances are
    /// not asked for protocols it lacks (a failed lookup on a polars Series runs its
    /// `__getattr__`, several microseconds each).
    fn attr(
        &self,
        name: &Bound<'py, PyString>,
        on_type: bool,
    ) -> Result<Option<Bound<'py, PyAny>>> {
        let protocols = self.protocols();
        let instance_lookups = protocols.dynamic && !protocols.arrow;
        if on_type || instance_lookups {
            Ok(self.obj.getattr_opt(name)?)
        } else {
            Ok(None) // neither the type nor (lacking a __dict__ or __getattr__) the instance has it
        }
    }
}

fn import_with(obj: &Bound<'_, PyAny>, any_exchange_api: bool) -> Result<Imported> {
    walk(&Probe {
        obj,
        any_exchange_api,
        protocols: std::cell::OnceCell::new(),
    })
}

#[cold]
fn unsupported(obj: &Bound<'_, PyAny>) -> Error {
    Error::type_(format!(
        "asdlpack() needs an object that supports DLPack (__dlpack__ or a DLPack capsule), the \
         CUDA array interface (__cuda_array_interface__), the Arrow PyCapsule interface \
         (__arrow_c_array__ / __arrow_c_stream__ and their device variants), the array interface \
         (__array_interface__ / __array_struct__), the buffer protocol or numpy's __array__; {} \
         supports none",
        array_interface::type_name(obj)
    ))
}

/// numpy's `__array__(copy=False)`, the last resort: the object's own memory as a numpy array,
/// or its own error (never a silent copy).
///
/// An `__array__` written before numpy 2 takes no `copy` keyword; numpy still calls it without
/// one (warning when `copy=False` was asked). Its array may be the object's memory or a copy,
/// and nothing tells which, so it is served read-only: a write through it could be lost.
fn numpy_array_of(obj: &Bound<'_, PyAny>, method: &Bound<'_, PyAny>) -> Result<Tensor> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item(intern!(py, "copy"), false)?;
    let (array, legacy) = match method.call((), Some(&kwargs)) {
        Ok(array) => (array, false),
        Err(err) if refuses_copy_keyword(py, &err) => {
            let warning = format!(
                "{}.__array__ takes no copy keyword (numpy 2 asks __array__ to take dtype and \
                 copy): its array may be a copy, so it is served read-only",
                array_interface::type_name(obj)
            );
            let category = py.get_type::<pyo3::exceptions::PyDeprecationWarning>();
            let message = std::ffi::CString::new(warning)
                .map_err(|_| Error::value("a type name with a NUL character"))?;
            PyErr::warn(py, &category, &message, 1)?;
            (method.call0()?, true)
        }
        Err(err) => return Err(err.into()),
    };
    if !protocols::of_type(&array.get_type()).ndarray {
        return Err(Error::type_(format!(
            "{}.__array__() returned {}, not a numpy array",
            array_interface::type_name(obj),
            array_interface::type_name(&array)
        )));
    }
    let mut tensor = import(&array)?.tensor;
    if legacy {
        tensor.make_readonly();
    }
    Ok(tensor)
}

/// Whether `err` is the TypeError of a call given a `copy` keyword it doesn't take (numpy asks
/// the same of the message before calling again without it).
fn refuses_copy_keyword(py: Python<'_>, err: &PyErr) -> bool {
    err.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
        && err.value(py).str().is_ok_and(|text| {
            let text = text.to_string_lossy();
            text.contains("'copy'") && text.contains("keyword")
        })
}

/// A numpy masked array exports its data without the mask (numpy's own `__dlpack__` and array
/// interface drop it), so one with masked elements would reach the consumer with whatever those
/// elements' memory holds: refused. Without masked elements its data are its values.
fn refuse_masked_elements(array: &Bound<'_, PyAny>) -> Result<()> {
    let py = array.py();
    let is_masked = py
        .import(intern!(py, "numpy.ma"))?
        .getattr(intern!(py, "is_masked"))?;
    if is_masked.call1((array,))?.is_truthy()? {
        return Err(Error::buffer(
            "a numpy masked array with masked elements can't be DLPack (DLPack has no mask): \
             pass .filled(value) for its values, or .data for the memory as it is",
        ));
    }
    Ok(())
}

/// Whether `tensor` (a torch tensor) is a nested one: a list of tensors of different shapes.
fn is_nested(tensor: &Bound<'_, PyAny>) -> bool {
    let py = tensor.py();
    tensor
        .getattr(intern!(py, "is_nested"))
        .and_then(|flag| flag.is_truthy())
        .unwrap_or(false)
}

#[cold]
fn nested_tensor() -> Error {
    Error::buffer(
        "a torch nested tensor has no single strided layout, so DLPack can't describe it: pad it \
         (nested.to_padded_tensor(0.0)) or unbind() it into a list of tensors",
    )
}

/// Whether torch's C exchange API gives this tensor's true values. It exports the raw memory
/// of tensors whose conjugate or negative bit is set (their values are the memory's conjugate
/// or negation) and of tensors that require grad, all of which torch's `__dlpack__` refuses:
/// those take the `__dlpack__` path, which raises torch's own error. The negative bit is
/// refused here, since torch's `__dlpack__` exports it without a word.
fn torch_exports_faithfully(tensor: &Bound<'_, PyAny>) -> Result<bool> {
    let py = tensor.py();
    let flag = |name| -> Result<bool> { Ok(tensor.call_method0(name)?.is_truthy()?) };
    if flag(intern!(py, "is_neg"))? {
        return Err(Error::buffer(
            "this torch tensor has its negative bit set (a lazy negation DLPack can't carry); \
             call .resolve_neg() first",
        ));
    }
    Ok(!flag(intern!(py, "is_conj"))?
        && !tensor.getattr(intern!(py, "requires_grad"))?.is_truthy()?)
}
