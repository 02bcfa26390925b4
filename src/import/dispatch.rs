//! `import`: which protocol an object is read through (see the module's doc for the order), and
//! what a type's exports mean (immutable JAX arrays, masked numpy arrays, torch's flags).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::{array_interface, arrow, buffer, cuda_array_interface, dlpack, numpy, protocols};
use crate::arrow_c::Method;
use crate::error::{Error, Result};
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

/// The ways `asdlpack` reads an object's memory, and the checks made on the way, in the order
/// they are tried (`ORDER`): each entry is tried by one function (`Step::run`), and the first
/// protocol the object speaks decides, except that a `BufferError` from the object's own
/// `__dlpack__` lets the protocols after it have their turn (and explains best if none serves).
/// `docs/guide/any-array.md` states this order; a test holds the two together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An exact numpy array, read from its C struct (numpy's array interface, without Python).
    NumpyStruct,
    /// A raw Arrow stream capsule (`"arrow_array_stream"`, or the device variant).
    ArrowStreamCapsule,
    /// A raw DLPack capsule (`"dltensor"`, `"dltensor_versioned"`).
    DlpackCapsule,
    /// Quirk: a numpy masked array with masked elements is refused (its exports drop the mask).
    RefuseMaskedElements,
    /// The DLPack C exchange API of the object's type (`__dlpack_c_exchange_api__`): any type's
    /// for `asdlpack`, only torch's where the memory itself is needed (see `import_in_place`);
    /// quirk: torch's only for tensors it exports faithfully (no conjugate or negative bit, not
    /// requiring grad).
    ExchangeApi,
    /// `__dlpack__`; quirks: a torch nested tensor's refusal is named, and an Arrow object's
    /// refusal (of whatever type) hands it to the Arrow interface.
    Dlpack,
    CudaArrayInterface,
    ArrayStruct,
    ArrayInterface,
    /// The Arrow PyCapsule interface (`__arrow_c_device_array__`, `__arrow_c_device_stream__`,
    /// `__arrow_c_array__`, `__arrow_c_stream__`): after the array interface, since an object
    /// with both (a Pillow image) describes its shape there, its Arrow export being a flat
    /// column of pixels.
    Arrow,
    Buffer,
    /// numpy's `__array__(copy=False)`, the last resort.
    NumpyArray,
}

/// The order, written once: it makes `ORDER`, and `walk`, which takes the steps in that order
/// written out one after another, so that each step's code is specialised where it stands (a
/// loop over the table, calling one function for every step, cost a tenth of an import).
macro_rules! in_order {
    ($($step:ident),+ $(,)?) => {
        /// The order, first to last.
        pub const ORDER: [Step; [$(Step::$step),+].len()] = [$(Step::$step),+];

        /// Take the steps in `ORDER` until one reads the memory or ends the search.
        #[inline(always)]
        fn walk(cx: &Probe<'_, '_>) -> Result<Imported> {
            // `__dlpack__`'s own BufferError, kept while the protocols after it are tried.
            let mut refused: Option<Error> = None;
            $(
                match Step::$step.run(cx) {
                    Ok(Some(imported)) => return Ok(cx.finish(Step::$step, imported)),
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

in_order!(
    NumpyStruct,
    ArrowStreamCapsule,
    DlpackCapsule,
    RefuseMaskedElements,
    ExchangeApi,
    Dlpack,
    CudaArrayInterface,
    ArrayStruct,
    ArrayInterface,
    Arrow,
    Buffer,
    NumpyArray,
);

impl Step {
    /// The protocol's name as the guide spells it; `None` for a check that reads nothing.
    pub fn protocol(self) -> Option<&'static str> {
        Some(match self {
            Step::NumpyStruct => "numpy's array struct",
            Step::ArrowStreamCapsule => "Arrow stream capsule",
            Step::DlpackCapsule => "DLPack capsule",
            Step::RefuseMaskedElements => return None,
            Step::ExchangeApi => "DLPack C exchange API",
            Step::Dlpack => "__dlpack__",
            Step::CudaArrayInterface => "__cuda_array_interface__",
            Step::ArrayStruct => "__array_struct__",
            Step::ArrayInterface => "__array_interface__",
            Step::Arrow => "Arrow PyCapsule interface",
            Step::Buffer => "buffer protocol",
            Step::NumpyArray => "__array__",
        })
    }

    /// Try this step on the object: `Some` when it read the memory, `None` when the object
    /// doesn't speak it (or, for a check, passed it); an error ends the search, but for
    /// `Refused`. Each step is a function of its own, so that `walk` calls straight into it.
    #[inline(always)]
    fn run(self, cx: &Probe<'_, '_>) -> Found {
        match self {
            Step::NumpyStruct => try_numpy_struct(cx),
            Step::ArrowStreamCapsule => try_arrow_stream_capsule(cx),
            Step::DlpackCapsule => try_dlpack_capsule(cx),
            Step::RefuseMaskedElements => try_masked_elements(cx),
            Step::ExchangeApi => try_exchange_api(cx),
            Step::Dlpack => try_dlpack(cx),
            Step::CudaArrayInterface => try_cuda_array_interface(cx),
            Step::ArrayStruct => try_array_struct(cx),
            Step::ArrayInterface => try_array_interface(cx),
            Step::Arrow => try_arrow(cx),
            Step::Buffer => try_buffer(cx),
            Step::NumpyArray => try_numpy_array(cx),
        }
    }
}

/// What a step gives: the memory read, nothing (the object doesn't speak it), or why it stops.
type Found = std::result::Result<Option<Imported>, Stop>;

fn found(tensor: Tensor) -> Option<Imported> {
    Some(Imported::of(tensor))
}

/// `Step::NumpyStruct`.
fn try_numpy_struct(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok({
        // Without the per-type lookup when numpy's type is known; else the first array
        // of the process, whose type the lookup just found to be numpy's.
        let array = numpy::ExactNdarray::new(obj).or_else(|| {
            cx.protocols()
                .ndarray
                .then(|| numpy::ExactNdarray::new(obj))
                .flatten()
        });
        match array {
            Some(array) => numpy::import(array)?.and_then(found),
            None => None,
        }
    })
}

/// `Step::ArrowStreamCapsule`.
fn try_arrow_stream_capsule(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok(match arrow::stream_capsule_kind(obj) {
        Some(kind) => found(arrow::import_stream(obj, kind)?),
        None => None,
    })
}

/// `Step::DlpackCapsule`.
fn try_dlpack_capsule(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok(match dlpack::is_capsule(obj) {
        true => found(dlpack::import_capsule(obj)?),
        false => None,
    })
}

/// `Step::RefuseMaskedElements`.
fn try_masked_elements(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok({
        if cx.protocols().numpy_masked {
            refuse_masked_elements(obj)?;
        }
        None
    })
}

/// `Step::ExchangeApi`.
fn try_exchange_api(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok({
        let protocols = cx.protocols();
        match protocols.exchange_api {
            Some(table)
                if (cx.any_exchange_api || protocols.torch)
                    && (!protocols.torch || torch_exports_faithfully(obj)?) =>
            {
                // SAFETY: `protocols` are those of `obj`'s type, so `table` is its
                // exchange API.
                unsafe { dlpack::import_exchange_api(obj, table) }.and_then(found)
            }
            _ => None,
        }
    })
}

/// `Step::Dlpack`.
fn try_dlpack(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    Ok({
        let Some(method) = cx.attr(intern!(py, "__dlpack__"), cx.protocols().dlpack)? else {
            return Ok(None);
        };
        match dlpack::import_producer(&method, None) {
            Ok(tensor) => {
                let on_device = !matches!(tensor.device().get(), Ok(d) if d.is_host());
                let producer = on_device.then(|| obj.clone().unbind());
                Some(Imported { tensor, producer })
            }
            Err(_) if cx.protocols().torch && is_nested(obj) => {
                return Err(nested_tensor().into());
            }
            Err(_) if cx.protocols().arrow => {
                let arrow = try_arrow(cx)?;
                Some(arrow.ok_or_else(|| Error::type_("the Arrow interface went away"))?)
            }
            Err(err) if err.is_buffer_error(py) => return Err(Stop::Refused(err)),
            Err(err) => return Err(err.into()),
        }
    })
}

/// `Step::CudaArrayInterface`.
fn try_cuda_array_interface(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    Ok({
        let declared = cx.protocols().cuda_array_interface;
        match cx.attr(intern!(py, "__cuda_array_interface__"), declared)? {
            Some(cai) => found(cuda_array_interface::import(obj, cai)?),
            None => None,
        }
    })
}

/// `Step::ArrayStruct`.
fn try_array_struct(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    Ok({
        let declared = cx.protocols().array_struct;
        match cx.attr(intern!(py, "__array_struct__"), declared)? {
            Some(capsule) => found(array_interface::import_struct(obj, capsule)?),
            None => None,
        }
    })
}

/// `Step::ArrayInterface`.
fn try_array_interface(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    Ok({
        let declared = cx.protocols().array_interface;
        match cx.attr(intern!(py, "__array_interface__"), declared)? {
            Some(interface) => found(array_interface::import(obj, interface)?),
            None => None,
        }
    })
}

/// `Step::Arrow`.
fn try_arrow(cx: &Probe<'_, '_>) -> Found {
    let py = cx.obj.py();
    Ok({
        for method in Method::ALL {
            let declared = cx.protocols().arrow_methods[method as usize];
            if let Some(bound) = cx.attr(protocols::arrow_name(py, method), declared)? {
                return Ok(found(arrow::import_method(&bound, method)?));
            }
        }
        None
    })
}

/// `Step::Buffer`.
fn try_buffer(cx: &Probe<'_, '_>) -> Found {
    let obj = cx.obj;
    Ok(match buffer::supports(obj) {
        true => found(buffer::import(obj)?),
        false => None,
    })
}

/// `Step::NumpyArray`.
fn try_numpy_array(cx: &Probe<'_, '_>) -> Found {
    let (obj, py) = (cx.obj, cx.obj.py());
    Ok({
        match cx.attr(intern!(py, "__array__"), cx.protocols().numpy_array)? {
            Some(method) => found(numpy_array_of(obj, &method)?),
            None => None,
        }
    })
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
    /// read-only, whatever its exports say.
    #[inline(always)]
    fn finish(&self, step: Step, mut imported: Imported) -> Imported {
        if step != Step::NumpyStruct && self.protocols().immutable {
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
fn numpy_array_of(obj: &Bound<'_, PyAny>, method: &Bound<'_, PyAny>) -> Result<Tensor> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item(intern!(py, "copy"), false)?;
    let array = method.call((), Some(&kwargs))?;
    if !protocols::of_type(&array.get_type()).ndarray {
        return Err(Error::type_(format!(
            "{}.__array__() returned {}, not a numpy array",
            array_interface::type_name(obj),
            array_interface::type_name(&array)
        )));
    }
    Ok(import(&array)?.tensor)
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
