//! A producer's Arrow C structs checked field by field before anything reads them. arrow-rs
//! reads an `ArrowSchema` and an `ArrowArray` on the producer's word: where they lie, it
//! panics (a NULL format, too few children) or reads out of bounds (a negative length, an
//! offset past the buffer). So every field a later read relies on is checked here first:
//!
//! - a schema's tree (`schema`): live, a UTF-8 format and name, its children and dictionary
//!   present and themselves sound, as many children as its format needs, a bounded depth, and
//!   a tree indeed (each struct reached once: see `Seen`); then its type one this crate carries (numbers, booleans, fixed-size lists of them, tables of
//!   them), which is all that is ever imported;
//! - each array against that type (`array`): live, lengths and offsets in range, the buffers
//!   and children that type has, each child long enough, and every buffer's extent a range of
//!   addresses that can exist.
//!
//! What no check can see, that a buffer really holds the bytes the length and offset say,
//! stays the producer's word.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_void};

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow_schema::{DataType, Field};

use super::arrow_values::{element_type, table_dtype, unsupported};
use crate::error::{Error, Result};
use crate::ffi::arrow::{ArrayFields, SchemaFields};

/// Deeper trees are refused: real types nest a few levels, and a cycle of children never ends.
const MAX_DEPTH: usize = 64;

/// The schemas a tree's walk has reached. A struct reached twice (the child of two parents, or
/// its own descendant) is refused: shared children make a tree of n structs stand for up to
/// 2^n nodes, which every later walk (arrow-rs's reading of the type, its names, an error
/// message that prints it) would expand, so the work stays that of the structs the producer
/// made. No producer shares them: each child is released by its own parent.
#[derive(Default)]
struct Seen(HashSet<*const FFI_ArrowSchema>);

impl Seen {
    /// The tree from `root`: a schema without children or dictionary (the common case) needs
    /// no set.
    fn walk(root: &FFI_ArrowSchema) -> Result<()> {
        let fields = SchemaFields::of(root);
        let mut seen = Seen::default();
        if fields.n_children != 0 || !fields.dictionary.is_null() {
            seen.0.insert(root);
        }
        schema_node(root, 0, &mut seen)
    }

    /// Mark `node` reached, refusing it if it was already.
    fn reach(&mut self, node: &FFI_ArrowSchema, what: impl std::fmt::Display) -> Result<()> {
        if self.0.insert(node) {
            return Ok(());
        }
        Err(malformed(
            "schema",
            format!(
                "its {what} is a schema already in the tree (shared with another parent, or its \
                 own ancestor): each node of a schema must be a struct of its own"
            ),
        ))
    }
}

/// A schema that passed `schema`: its type, which `array` checks arrays against, and its
/// metadata (extension types). Its name, which nothing reads, is not copied out.
pub struct Schema {
    data_type: DataType,
    metadata: HashMap<String, String>,
}

impl Schema {
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Its field, unnamed.
    pub fn field(&self) -> Field {
        Field::new("", self.data_type.clone(), true).with_metadata(self.metadata.clone())
    }
}

/// An array that passed `array` against a `Schema`'s type, and the bytes its buffers span,
/// children included (its memory, for limits), as the check found them: their sum, which
/// saturates (each extent is below the address space, but a tree may have many, and buffers
/// shared between them are counted each time).
pub struct Array(FFI_ArrowArray, u64);

impl Array {
    pub fn get(&self) -> &FFI_ArrowArray {
        &self.0
    }

    pub fn span_bytes(&self) -> u64 {
        self.1
    }

    pub fn into_inner(self) -> FFI_ArrowArray {
        self.0
    }
}

/// Check a schema's tree, read its field, and refuse types this crate doesn't carry
/// (`TypeError`, naming the type).
pub fn schema(schema: &FFI_ArrowSchema) -> Result<Schema> {
    Seen::walk(schema)?;
    let data_type = DataType::try_from(schema).map_err(|err| malformed("schema", err))?;
    let metadata = schema.metadata().map_err(|err| malformed("schema", err))?;
    carried(&data_type, "this Arrow array ")?;
    Ok(Schema {
        data_type,
        metadata,
    })
}

/// A schema's tree checked and read as a field, whatever its type (for a consumer's requested
/// schema, compared with what we give).
pub fn readable(schema: &FFI_ArrowSchema) -> Result<Field> {
    Seen::walk(schema)?;
    Field::try_from(schema).map_err(|err| malformed("schema", err))
}

fn schema_node(schema: &FFI_ArrowSchema, depth: usize, seen: &mut Seen) -> Result<()> {
    let fields = SchemaFields::of(schema);
    if depth > MAX_DEPTH {
        return Err(malformed(
            "schema",
            format!("nests deeper than {MAX_DEPTH} levels"),
        ));
    }
    if fields.release.is_none() {
        return Err(released("schema"));
    }
    if fields.format.is_null() {
        return Err(malformed("schema", "its format is NULL"));
    }
    // SAFETY: a live schema's non-NULL format is a NUL-terminated string the schema owns (the
    // interface's rule; the producer's word).
    let format = unsafe { CStr::from_ptr(fields.format) };
    let format = format
        .to_str()
        .map_err(|_| malformed("schema", "its format is not UTF-8"))?;
    if !fields.name.is_null() {
        // SAFETY: a live schema's non-NULL name is a NUL-terminated string the schema owns (the
        // interface's rule; the producer's word).
        let name = unsafe { CStr::from_ptr(fields.name) };
        name.to_str()
            .map_err(|_| malformed("schema", "its name is not UTF-8"))?;
    }
    let children = count("schema", "children", fields.n_children)?;
    if children > 0 && fields.children.is_null() {
        return Err(malformed(
            "schema",
            format!("it has {children} children but no children pointer"),
        ));
    }
    for index in 0..children {
        // SAFETY: a non-NULL children pointer of a live schema points to `n_children`
        // pointers (the producer's word); `index` is below that count.
        let child = unsafe { *fields.children.wrapping_add(index) };
        // SAFETY: a child pointer is NULL or a schema that lives as long as its parent.
        let Some(child) = (unsafe { child.as_ref() }) else {
            return Err(malformed("schema", format!("its child {index} is NULL")));
        };
        seen.reach(child, format_args!("child {index}"))?;
        schema_node(child, depth + 1, seen)?;
    }
    // SAFETY: the dictionary is NULL or a schema that lives as long as its parent.
    if let Some(dictionary) = unsafe { fields.dictionary.as_ref() } {
        seen.reach(dictionary, "dictionary")?;
        schema_node(dictionary, depth + 1, seen)?;
    }
    let needed = children_needed(format);
    if children < needed {
        return Err(malformed(
            "schema",
            format!("its format {format:?} needs {needed} child type(s), it has {children}"),
        ));
    }
    Ok(())
}

/// The children a format's type can't be read without (arrow-rs asserts they are there).
fn children_needed(format: &str) -> usize {
    match format {
        "+l" | "+L" | "+vl" | "+vL" | "+m" => 1,
        "+r" => 2,
        format if format.starts_with("+w:") => 1,
        _ => 0,
    }
}

/// Whether `data_type` is one this crate reads: numbers and booleans, fixed-size lists of them
/// (to any depth), and tables (structs) whose columns share one such type.
fn carried(data_type: &DataType, what: &str) -> Result<()> {
    match data_type {
        DataType::FixedSizeList(child, size) => {
            if *size < 0 {
                return Err(malformed(
                    "schema",
                    format!("its fixed-size list has a negative size ({size})"),
                ));
            }
            carried(child.data_type(), what)
        }
        DataType::Struct(columns) => table_dtype(columns).map(|_| ()),
        other if element_type(other).is_some() => Ok(()),
        other => Err(unsupported(other, what)),
    }
}

/// Check `array` against `schema`'s type, before anything reads it.
pub fn array(schema: &Schema, array: FFI_ArrowArray) -> Result<Array> {
    let bytes = array_node(&array, &schema.data_type)?;
    Ok(Array(array, bytes))
}

/// Check one array of the tree; the bytes its buffers and children span.
fn array_node(array: &FFI_ArrowArray, data_type: &DataType) -> Result<u64> {
    let fields = ArrayFields::of(array);
    if fields.release.is_none() {
        return Err(released("array"));
    }
    if fields.length < 0 || fields.offset < 0 || fields.null_count < -1 {
        return Err(malformed(
            "array",
            format!(
                "its length ({}), offset ({}) or null count ({}) is negative",
                fields.length, fields.offset, fields.null_count
            ),
        ));
    }
    let end = fields
        .offset
        .checked_add(fields.length)
        .ok_or_else(|| too_large(fields))?;
    if !fields.dictionary.is_null() {
        return Err(malformed(
            "array",
            "it has a dictionary its type doesn't have",
        ));
    }
    let (n_buffers, n_children) = match data_type {
        DataType::FixedSizeList(..) => (1, 1),
        DataType::Struct(columns) => (1, columns.len()),
        _ => (2, 0),
    };
    if count("array", "buffers", fields.n_buffers)? != n_buffers
        || count("array", "children", fields.n_children)? != n_children
    {
        return Err(malformed(
            "array",
            format!(
                "it has {} buffers and {} children, where its type {data_type} has {n_buffers} \
                 and {n_children}",
                fields.n_buffers, fields.n_children
            ),
        ));
    }
    if fields.buffers.is_null() {
        return Err(malformed("array", "its buffers pointer is NULL"));
    }
    // SAFETY: a live array's non-NULL buffers pointer points to `n_buffers` pointers (the
    // producer's word), here at least one.
    let validity = unsafe { *fields.buffers };
    let end = end as u64;
    let bitmap = end.div_ceil(8);
    extent(validity, bitmap, fields)?;
    // A missing bitmap spans nothing: only buffers there (each checked by `extent`) count.
    let bitmap = if validity.is_null() { 0 } else { bitmap };
    if fields.null_count > 0 && validity.is_null() {
        return Err(malformed(
            "array",
            format!(
                "it says it has {} nulls but has no validity bitmap",
                fields.null_count
            ),
        ));
    }
    match data_type {
        DataType::FixedSizeList(child, size) => {
            let needed = end
                .checked_mul(*size as u64)
                .ok_or_else(|| too_large(fields))?;
            Ok(bitmap.saturating_add(child_node(fields, 0, needed, child.data_type())?))
        }
        DataType::Struct(columns) => {
            let mut bytes = bitmap;
            for (index, column) in columns.iter().enumerate() {
                bytes = bytes.saturating_add(child_node(fields, index, end, column.data_type())?);
            }
            Ok(bytes)
        }
        other => {
            let bytes = match element_type(other) {
                Some(_) if other == &DataType::Boolean => end.div_ceil(8),
                Some(dtype) => end
                    .checked_mul(dtype.itemsize() as u64)
                    .ok_or_else(|| too_large(fields))?,
                None => return Err(unsupported(other, "this Arrow array ")),
            };
            // SAFETY: a live array's non-NULL buffers pointer points to `n_buffers` pointers
            // (the producer's word), here two (checked above).
            let values = unsafe { *fields.buffers.wrapping_add(1) };
            if values.is_null() && bytes > 0 {
                return Err(malformed("array", "its values buffer is NULL"));
            }
            extent(values, bytes, fields)?;
            Ok(bitmap.saturating_add(bytes))
        }
    }
}

/// Child `index` of a checked array: present, at least `needed` long, and sound itself; the
/// bytes it spans.
fn child_node(
    parent: &ArrayFields,
    index: usize,
    needed: u64,
    data_type: &DataType,
) -> Result<u64> {
    if parent.children.is_null() {
        return Err(malformed("array", "its children pointer is NULL"));
    }
    // SAFETY: a live array's non-NULL children pointer points to `n_children` pointers (the
    // producer's word); `index` is below that count (checked by the caller).
    let child = unsafe { *parent.children.wrapping_add(index) };
    // SAFETY: a child pointer is NULL or an array that lives as long as its parent.
    let Some(child) = (unsafe { child.as_ref() }) else {
        return Err(malformed("array", format!("its child {index} is NULL")));
    };
    let fields = ArrayFields::of(child);
    if fields.length >= 0 && (fields.length as u64) < needed {
        return Err(malformed(
            "array",
            format!(
                "its child {index} has {} elements where the parent's length and offset need {needed}",
                fields.length
            ),
        ));
    }
    array_node(child, data_type)
}

/// A buffer's `bytes` from `start` must be addresses that can exist: a range that neither
/// wraps nor passes the top of a process's address space. A lying length or offset is caught
/// here, though not one whose range stays inside that space.
fn extent(start: *const c_void, bytes: u64, fields: &ArrayFields) -> Result<()> {
    if start.is_null() {
        return Ok(());
    }
    let fits = (start as u64)
        .checked_add(bytes)
        .is_some_and(|last| last <= ADDRESS_SPACE);
    if fits { Ok(()) } else { Err(too_large(fields)) }
}

/// The top of a process's address space: 56 bits on the 64-bit processors whose page tables
/// reach furthest (x86-64 with five levels, RISC-V Sv57; AArch64 has 52), else what Rust's
/// slices allow.
const ADDRESS_SPACE: u64 = if cfg!(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
)) {
    1 << 56
} else {
    isize::MAX as u64
};

fn count(what: &str, of: &str, n: i64) -> Result<usize> {
    usize::try_from(n).map_err(|_| malformed(what, format!("its number of {of} is negative ({n})")))
}

#[cold]
fn too_large(fields: &ArrayFields) -> Error {
    malformed(
        "array",
        format!(
            "its length ({}) and offset ({}) reach past the memory this process can address",
            fields.length, fields.offset
        ),
    )
}

#[cold]
fn released(what: &str) -> Error {
    Error::value(format!(
        "the Arrow {what} is released (its release callback is NULL): it was read already, \
         perhaps imported by another consumer; ask its producer for a new one"
    ))
}

#[cold]
fn malformed(what: &str, why: impl std::fmt::Display) -> Error {
    Error::value(format!("the Arrow {what} is malformed: {why}"))
}
