//! What Arrow arrays become (see `arrow` for how they are read): one chunk of numbers in place,
//! an array's offset honoured; `FixedSizeList`s of them (nested to any depth) N-d, and the
//! `arrow.fixed_shape_tensor` extension type its tensors in their logical order (`permutation`).
//! Booleans (bits), several chunks and tables whose columns share one numeric type (rows x
//! columns) are one copy. Nulls and other types are refused, naming what.

use std::ffi::c_void;

use arrow_data::ArrayData;
use arrow_schema::{DataType, Field};
use dlpack_core::abi::type_code as tc;
use dlpack_core::dtype::DType;

use crate::error::{Error, Result};
use crate::tensor::{Device, Owner, Storage, Tensor};
use dlpack_core::layout::Layout;
use dlpack_core::memory::AlignedBuffer;

/// The storage of an imported Arrow array's values: on the host, in native order.
pub fn host_values(data: *mut c_void, dtype: DType) -> Storage {
    Storage {
        data,
        device: Device::CPU,
        dtype,
        // Arrow memory is immutable: consumers may share it, never write it.
        readonly: true,
        swapped: false,
        indirect: false,
        stream: None,
    }
}

/// The Arrow types DLPack carries and their element types: the one table both directions
/// (import here, `export::arrow`) read.
static ELEMENT_TYPES: [(DataType, DType); 12] = [
    (DataType::Int8, DType::new(tc::INT, 8)),
    (DataType::Int16, DType::new(tc::INT, 16)),
    (DataType::Int32, DType::new(tc::INT, 32)),
    (DataType::Int64, DType::new(tc::INT, 64)),
    (DataType::UInt8, DType::new(tc::UINT, 8)),
    (DataType::UInt16, DType::new(tc::UINT, 16)),
    (DataType::UInt32, DType::new(tc::UINT, 32)),
    (DataType::UInt64, DType::new(tc::UINT, 64)),
    (DataType::Float16, DType::new(tc::FLOAT, 16)),
    (DataType::Float32, DType::new(tc::FLOAT, 32)),
    (DataType::Float64, DType::new(tc::FLOAT, 64)),
    (DataType::Boolean, DType::new(tc::BOOL, 8)),
];

/// The element type of an Arrow primitive type DLPack carries, if it is one. The table's types
/// carry no parameters, so their variant alone tells them apart (far cheaper than `==` on a
/// `DataType`, on every import's path).
pub fn element_type(data_type: &DataType) -> Option<DType> {
    let variant = std::mem::discriminant(data_type);
    ELEMENT_TYPES
        .iter()
        .find(|(arrow, _)| std::mem::discriminant(arrow) == variant)
        .map(|&(_, dtype)| dtype)
}

/// The Arrow type of a DLPack element type, if Arrow has one.
pub fn arrow_type(dtype: DType) -> Option<DataType> {
    ELEMENT_TYPES
        .iter()
        .find(|&&(_, d)| d == dtype)
        .map(|(arrow, _)| arrow.clone())
}

/// The values of a chunk: its leaf (primitive) data, the first leaf element it reaches (a
/// logical index of the leaf, its own offset not added), and its shape (the chunk's length,
/// then each `FixedSizeList`'s size).
struct Values<'a> {
    leaf: &'a ArrayData,
    start: usize,
    shape: Vec<usize>,
}

/// Walk a chunk down its `FixedSizeList`s to the numbers, refusing nulls on the way.
fn values<'a>(data: &'a ArrayData, column: &str) -> Result<Values<'a>> {
    let mut shape = vec![data.len()];
    let (mut node, mut start, mut count) = (data, 0usize, data.len());
    loop {
        refuse_nulls(node, start, count, column)?;
        match node.data_type() {
            DataType::FixedSizeList(_, size) => {
                let size = usize::try_from(*size).map_err(|_| unreadable_sizes())?;
                let child = node.child_data().first().ok_or_else(unreadable_sizes)?;
                // `child_data` is the whole child: the list's own offset picks its part.
                start = node
                    .offset()
                    .checked_add(start)
                    .and_then(|first| first.checked_mul(size))
                    .ok_or_else(unreadable_sizes)?;
                count = count.checked_mul(size).ok_or_else(unreadable_sizes)?;
                shape.push(size);
                node = child;
            }
            data_type if element_type(data_type).is_some() => {
                return Ok(Values {
                    leaf: node,
                    start,
                    shape,
                });
            }
            other => return Err(unsupported(other, column)),
        }
    }
}

/// Offsets and lengths of nested lists that no memory holds (each is checked where the array is
/// imported, `arrow_check`: this is the same bound, where the numbers are used).
#[cold]
fn unreadable_sizes() -> Error {
    Error::value(
        "the Arrow array's lengths and offsets reach past the memory this process can address",
    )
}

fn refuse_nulls(data: &ArrayData, start: usize, count: usize, column: &str) -> Result<()> {
    let Some(nulls) = data.nulls() else {
        return Ok(());
    };
    let nulls = nulls.slice(start, count).null_count();
    if nulls > 0 {
        return Err(Error::buffer(format!(
            "{column}has {nulls} null{} and DLPack has no nulls: fill them first (fill_null() in \
             polars and pyarrow.compute, fillna() in pandas)",
            if nulls == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}

#[cold]
pub fn unsupported(data_type: &DataType, column: &str) -> Error {
    Error::type_(format!(
        "{column}is of Arrow type {data_type}, which DLPack can't carry (fixed-width numbers, \
         booleans and fixed-size lists of them can)"
    ))
}

/// A tensor of the chunks of one field: in place for one chunk of numbers, a copy otherwise.
pub fn from_chunks(field: &Field, chunks: Vec<ArrayData>) -> Result<Tensor> {
    if let DataType::Struct(columns) = field.data_type() {
        return table(columns, &chunks);
    }
    let column = "this Arrow array ";
    let tensor_shape = fixed_shape_tensor(field)?;
    if let [chunk] = chunks.as_slice()
        && chunk.data_type() != &DataType::Boolean
        && !matches!(leaf_type(chunk.data_type()), Some(DataType::Boolean))
    {
        let values = values(chunk, column)?;
        return in_place(chunk.clone(), &values, tensor_shape.as_ref());
    }
    // Several chunks, or bits: one C-ordered copy.
    let mut parts = Vec::with_capacity(chunks.len());
    for chunk in &chunks {
        parts.push(values(chunk, column)?);
    }
    let leaf_type = match parts.first() {
        Some(part) => part.leaf.data_type().clone(),
        None => leaf_type(field.data_type())
            .cloned()
            .ok_or_else(|| unsupported(field.data_type(), column))?,
    };
    let dtype = element_type(&leaf_type).ok_or_else(|| unsupported(&leaf_type, column))?;
    let inner: Vec<usize> = fixed_sizes(field.data_type());
    let rows = total_rows(parts.iter().map(|p| p.shape[0]))?;
    let mut shape = vec![rows];
    shape.extend(&inner);
    let bits = leaf_type == DataType::Boolean;
    let why = match (chunks.len(), bits) {
        (0, _) => "the Arrow stream has no chunks: a new empty array".to_owned(),
        (1, _) => "Arrow booleans are bits: one copy makes them bytes".to_owned(),
        (n, false) => format!("the Arrow stream has {n} chunks: one copy joins them"),
        (n, true) => format!(
            "the Arrow stream has {n} chunks of booleans (bits): one copy joins them as bytes"
        ),
    };
    let copy = gather(dtype, &shape, parts.iter().map(|p| (p, p.leaf)), why)?;
    apply_tensor_shape(copy, tensor_shape.as_ref())
}

/// The leaf type under any `FixedSizeList`s.
fn leaf_type(data_type: &DataType) -> Option<&DataType> {
    match data_type {
        DataType::FixedSizeList(child, _) => leaf_type(child.data_type()),
        other => element_type(other).map(|_| other),
    }
}

fn fixed_sizes(data_type: &DataType) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut node = data_type;
    while let DataType::FixedSizeList(child, size) = node {
        sizes.push(*size as usize);
        node = child.data_type();
    }
    sizes
}

/// A chunk of numbers, served where it is: the leaf's values buffer from its first element.
fn in_place(chunk: ArrayData, values: &Values<'_>, tensor: Option<&TensorShape>) -> Result<Tensor> {
    let leaf = values.leaf;
    let dtype = element_type(leaf.data_type()).ok_or_else(|| unsupported(leaf.data_type(), ""))?;
    let itemsize = dtype.itemsize();
    let buffer = leaf.buffers().first().ok_or_else(unreadable_sizes)?;
    let extents = values
        .shape
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| unreadable_sizes()))
        .collect::<Result<Vec<i64>>>()?;
    // The layout checks that the elements' count and bytes fit in an i64.
    let layout = Layout::c_order(&extents, itemsize)?;
    let numel = layout.numel() as usize;
    let first = leaf
        .offset()
        .checked_add(values.start)
        .and_then(|first| first.checked_mul(itemsize))
        .ok_or_else(unreadable_sizes)?;
    if numel > 0
        && first
            .checked_add(numel * itemsize)
            .is_none_or(|end| end > buffer.len())
    {
        return Err(Error::value(
            "the Arrow array's buffer is smaller than its length and offset say",
        ));
    }
    let data = buffer.as_ptr().wrapping_add(first).cast_mut().cast();
    let storage = host_values(data, dtype);
    // SAFETY: read-only host memory of the chunk's values buffer, which the owner keeps alive:
    // the C-ordered layout's `numel` elements from `first` lie within the buffer (checked just
    // above), on arrow-rs's import of the producer's array (the producer's word for the buffer
    // itself, which nothing can check).
    let tensor_of = unsafe { Tensor::new(storage, layout, Owner::arrow(chunk)) };
    apply_tensor_shape(tensor_of, tensor)
}

/// The rows of several chunks together; a `MemoryError` past what any memory holds.
fn total_rows(rows: impl Iterator<Item = usize>) -> Result<usize> {
    rows.into_iter()
        .try_fold(0usize, usize::checked_add)
        .ok_or_else(|| too_large("the chunks' rows together"))
}

#[cold]
fn too_large(what: &str) -> Error {
    Error::Core(dlpack_core::error::Error::memory(format!(
        "can't copy Arrow data: {what} pass the address space"
    )))
}

/// The bytes of a C-ordered copy of `shape`; a `MemoryError` for sizes no memory holds.
fn copy_bytes(shape: &[usize], itemsize: usize) -> Result<usize> {
    elements(shape)
        .and_then(|n| n.checked_mul(itemsize))
        .filter(|&bytes| bytes <= isize::MAX as usize)
        .ok_or_else(|| too_large(&format!("the {shape:?} elements")))
}

/// The elements of `shape`: none where an extent is 0, however large the others; `None` where
/// the count passes `usize`.
fn elements(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1usize, |n, &extent| n.checked_mul(extent))
}

/// The values buffer of `leaf` and the range of it that `count` elements from element `first`
/// fill: in bits for booleans, in bytes otherwise. arrow-rs sized the buffer from the lengths
/// and offsets `arrow_check` bounded, so they are there; checked again where the numbers are
/// used, a `ValueError` otherwise.
fn leaf_range(
    leaf: &ArrayData,
    first: usize,
    count: usize,
    itemsize: usize,
) -> Result<(&arrow_buffer::Buffer, std::ops::Range<usize>)> {
    let buffer = leaf.buffers().first().ok_or_else(unreadable_sizes)?;
    let (unit, size) = if leaf.data_type() == &DataType::Boolean {
        (1, buffer.len().checked_mul(8))
    } else {
        (itemsize, Some(buffer.len()))
    };
    let range = first.checked_mul(unit).zip(
        first
            .checked_add(count)
            .and_then(|end| end.checked_mul(unit)),
    );
    match (range, size) {
        (Some((start, end)), Some(size)) if end <= size => Ok((buffer, start..end)),
        _ => Err(Error::value(
            "the Arrow array's buffer is smaller than its length and offset say",
        )),
    }
}

/// Copy parts (each with its leaf data) into one C-ordered tensor of `shape`, booleans' bits
/// into bytes.
fn gather<'a>(
    dtype: DType,
    shape: &[usize],
    parts: impl Iterator<Item = (&'a Values<'a>, &'a ArrayData)>,
    why: String,
) -> Result<Tensor> {
    let itemsize = dtype.itemsize();
    let buffer = AlignedBuffer::new(copy_bytes(shape, itemsize)?)?;
    let mut at = 0usize;
    for (part, leaf) in parts {
        // At most the copy's elements (`shape` counts every part's rows), so `at` stays in it.
        let count = elements(&part.shape).ok_or_else(unreadable_sizes)?;
        let first = leaf
            .offset()
            .checked_add(part.start)
            .ok_or_else(unreadable_sizes)?;
        let (source, range) = leaf_range(leaf, first, count, itemsize)?;
        let dst = buffer.as_ptr().wrapping_add(at * itemsize);
        if leaf.data_type() == &DataType::Boolean {
            let bits = arrow_buffer::BooleanBuffer::new(source.clone(), range.start, count);
            for (k, bit) in bits.iter().enumerate() {
                // SAFETY: `dst` has room for `count` one-byte elements from here (the buffer
                // holds every part's elements).
                unsafe { dst.wrapping_add(k).write(u8::from(bit)) };
            }
        } else {
            let src = &source.as_slice()[range];
            // SAFETY: `dst` has room for `count` elements of `itemsize` bytes (the buffer holds
            // every part's elements), the length of `src`, another allocation's bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        }
        at += count;
    }
    let extents: Vec<i64> = shape.iter().map(|&n| n as i64).collect();
    Tensor::host_copy(buffer, dtype, Layout::c_order(&extents, itemsize)?, why)
}

/// The element type a table's columns share; a `TypeError` naming the column that differs, or
/// one of a type DLPack can't carry.
pub fn table_dtype(columns: &arrow_schema::Fields) -> Result<DType> {
    let mut dtype = None;
    for field in columns.iter() {
        let column = format!("column {:?} ", field.name());
        let this = element_type(field.data_type())
            .ok_or_else(|| unsupported(field.data_type(), &column))?;
        match dtype {
            None => dtype = Some((this, field.name().clone())),
            Some((first, ref name)) if first != this => {
                return Err(Error::type_(format!(
                    "column {:?} is {}, column {name:?} {}: a table becomes one array only when \
                     its columns share one numeric type (cast them first)",
                    field.name(),
                    this.name(),
                    first.name()
                )));
            }
            Some(_) => {}
        }
    }
    match dtype {
        Some((dtype, _)) => Ok(dtype),
        None => Err(Error::type_("a table without columns can't be an array")),
    }
}

/// A table (a struct array: record batches, data frames) whose columns share one numeric type:
/// one rows x columns copy.
fn table(columns: &arrow_schema::Fields, chunks: &[ArrayData]) -> Result<Tensor> {
    let dtype = table_dtype(columns)?;
    let rows = total_rows(chunks.iter().map(ArrayData::len))?;
    let ncols = columns.len();
    let itemsize = dtype.itemsize();
    // Column by column into a column-major copy, then transposed into C order by the copy
    // engine would be two copies: instead each column is written with the row stride.
    let buffer = AlignedBuffer::new(copy_bytes(&[rows, ncols], itemsize)?)?;
    let mut row0 = 0usize;
    for chunk in chunks {
        refuse_nulls(chunk, 0, chunk.len(), "the table ")?;
        for (j, (field, column)) in columns.iter().zip(chunk.child_data()).enumerate() {
            let name = format!("column {:?} ", field.name());
            // A struct's children are whole: the struct's offset picks their rows.
            let part = values(column, &name)?;
            let first = column
                .offset()
                .checked_add(part.start)
                .and_then(|first| first.checked_add(chunk.offset()))
                .ok_or_else(unreadable_sizes)?;
            let leaf = part.leaf;
            // The column's rows, checked in its buffer once; the indices below stay in them.
            let (source, range) = leaf_range(leaf, first, chunk.len(), itemsize)?;
            for i in 0..chunk.len() {
                let dst = buffer
                    .as_ptr()
                    .wrapping_add(((row0 + i) * ncols + j) * itemsize);
                if leaf.data_type() == &DataType::Boolean {
                    let bit = arrow_buffer::bit_util::get_bit(source.as_slice(), range.start + i);
                    // SAFETY: inside the buffer: row < rows, column < ncols.
                    unsafe { dst.write(u8::from(bit)) };
                } else {
                    let src = &source.as_slice()[range.start + i * itemsize..][..itemsize];
                    // SAFETY: `itemsize` bytes inside the buffer (row < rows, column < ncols),
                    // the length of `src`, another allocation's bytes.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, itemsize) };
                }
            }
        }
        row0 += chunk.len();
    }
    let layout = Layout::c_order(&[rows as i64, ncols as i64], itemsize)?;
    let why = format!("an Arrow table of {ncols} columns: one rows x columns copy");
    Tensor::host_copy(buffer, dtype, layout, why)
}

/// The `arrow.fixed_shape_tensor` extension type's tensors: physical shape and permutation.
pub struct TensorShape {
    pub shape: Vec<usize>,
    pub permutation: Option<Vec<usize>>,
}

/// The tensors' shape of a field of the `arrow.fixed_shape_tensor` extension type (`None` for
/// any other field); a `ValueError` for metadata that doesn't say one.
pub fn fixed_shape_tensor(field: &Field) -> Result<Option<TensorShape>> {
    let metadata = field.metadata();
    if metadata.get("ARROW:extension:name").map(String::as_str) != Some("arrow.fixed_shape_tensor")
    {
        return Ok(None);
    }
    let bad = || Error::value("an arrow.fixed_shape_tensor type with unreadable metadata");
    let json = metadata.get("ARROW:extension:metadata").ok_or_else(bad)?;
    let parsed: serde_json::Value = serde_json::from_str(json).map_err(|_| bad())?;
    let list = |key: &str| -> Result<Option<Vec<usize>>> {
        match parsed.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().map(|n| n as usize).ok_or_else(bad))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(bad()),
        }
    };
    let shape = list("shape")?.ok_or_else(bad)?;
    let permutation = list("permutation")?;
    if let Some(p) = &permutation {
        let mut sorted = p.clone();
        sorted.sort_unstable();
        if sorted != (0..shape.len()).collect::<Vec<_>>() {
            return Err(bad());
        }
    }
    Ok(Some(TensorShape { shape, permutation }))
}

/// Reshape a tensor of rows x (flat tensor elements) to rows x the tensors' logical shape.
fn apply_tensor_shape(tensor: Tensor, shape: Option<&TensorShape>) -> Result<Tensor> {
    let Some(TensorShape { shape, permutation }) = shape else {
        return Ok(tensor);
    };
    if !tensor.layout().is_c_contiguous() {
        return Err(Error::runtime(
            "internal error: an arrow.fixed_shape_tensor's rows are not in C order",
        ));
    }
    let rows = tensor.layout().shape()[0];
    let per_row: usize = shape.iter().product();
    if tensor.layout().shape()[1..].iter().product::<i64>() as usize != per_row {
        return Err(Error::value(
            "an arrow.fixed_shape_tensor whose shape doesn't match its list size",
        ));
    }
    let itemsize = tensor.dtype().itemsize() as i64;
    let mut physical: Vec<i64> = vec![rows];
    physical.extend(shape.iter().map(|&n| n as i64));
    let c = Layout::c_order(&physical, itemsize as usize)?;
    let (mut extents, mut strides) = (vec![rows], vec![c.byte_strides()[0]]);
    for k in 0..shape.len() {
        // Logical dimension k is physical dimension permutation[k].
        let p = permutation.as_ref().map_or(k, |perm| perm[k]);
        extents.push(physical[p + 1]);
        strides.push(c.byte_strides()[p + 1]);
    }
    let layout = Layout::from_byte_strides(&extents, Some(&strides), itemsize as usize)?;
    // SAFETY: the tensor is C-ordered, `rows` x `per_row` elements (both checked above), so its
    // elements fill the bytes from its data up to `rows * per_row` items; `layout` reaches the
    // same elements in another order (the physical C order, permuted).
    Ok(unsafe { tensor.with_layout(layout) })
}
