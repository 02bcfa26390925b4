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

/// The checks met directly, with structs laid out as a producer could lay them out (arrow-rs
/// makes only sound ones): each lie refused with its own message, each bound at its edge, and
/// the bytes an array spans. The Python suite meets the same lies through real capsules
/// (test_arrow_hostile.py); these reach every check without building the extension.
#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::HashMap;
    use std::ffi::{CStr, c_void};
    use std::ptr;
    use std::sync::Arc;

    use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
    use arrow_schema::{DataType, Field, Fields};
    use dlpack_core::error::Error as CoreError;

    use super::{ADDRESS_SPACE, MAX_DEPTH, Schema, Seen, array, readable, schema};
    use crate::error::{Error, Result};
    use crate::ffi::arrow::{ArrayFields, SchemaFields};

    /// A release that frees nothing: every pointer a forged struct holds is the test's.
    unsafe extern "C" fn keep_schema(_: *mut FFI_ArrowSchema) {}
    unsafe extern "C" fn keep_array(_: *mut FFI_ArrowArray) {}

    /// A live schema node of this format, without name, children or dictionary.
    fn node(format: &'static CStr) -> SchemaFields {
        SchemaFields {
            format: format.as_ptr(),
            name: ptr::null(),
            metadata: ptr::null(),
            flags: 0,
            n_children: 0,
            children: ptr::null(),
            dictionary: ptr::null(),
            release: Some(keep_schema),
            private_data: ptr::null_mut(),
        }
    }

    /// `node` with these children (which must outlive it).
    fn parent(format: &'static CStr, children: &[*const FFI_ArrowSchema]) -> SchemaFields {
        SchemaFields {
            n_children: children.len() as i64,
            children: children.as_ptr(),
            ..node(format)
        }
    }

    /// `parent` with children set after it is made (a cycle back to it).
    fn parent_later(
        format: &'static CStr,
        children: &[Cell<*const FFI_ArrowSchema>],
    ) -> SchemaFields {
        SchemaFields {
            n_children: children.len() as i64,
            // `Cell` is `repr(transparent)`: these are the pointers themselves.
            children: children.as_ptr().cast(),
            ..node(format)
        }
    }

    fn forged_schema(fields: SchemaFields) -> Box<FFI_ArrowSchema> {
        // SAFETY: both are the header's `ArrowSchema`, `#[repr(C)]`, of one size and layout
        // (asserted in ffi::arrow), plain data; its release frees nothing, so arrow-rs's drop,
        // which calls it, is sound.
        Box::new(unsafe { std::mem::transmute::<SchemaFields, FFI_ArrowSchema>(fields) })
    }

    /// A live array of this length and these buffers and children (which must outlive it).
    fn fields(
        length: i64,
        buffers: &[*const c_void],
        children: &[*const FFI_ArrowArray],
    ) -> ArrayFields {
        ArrayFields {
            length,
            null_count: 0,
            offset: 0,
            n_buffers: buffers.len() as i64,
            n_children: children.len() as i64,
            buffers: buffers.as_ptr(),
            children: if children.is_empty() {
                ptr::null()
            } else {
                children.as_ptr()
            },
            dictionary: ptr::null(),
            release: Some(keep_array),
            private_data: ptr::null_mut(),
        }
    }

    fn forged_array(fields: ArrayFields) -> FFI_ArrowArray {
        // SAFETY: as `forged_schema`, for the header's `ArrowArray`.
        unsafe { std::mem::transmute::<ArrayFields, FFI_ArrowArray>(fields) }
    }

    fn checked_schema(data_type: &DataType) -> Schema {
        let ffi = FFI_ArrowSchema::try_from(data_type).unwrap();
        match schema(&ffi) {
            Ok(checked) => checked,
            Err(err) => panic!("{data_type} refused: {err:?}"),
        }
    }

    /// The bytes a forged array of `data_type` spans, as `array` finds them.
    fn span(data_type: &DataType, fields: ArrayFields) -> Result<u64> {
        array(&checked_schema(data_type), forged_array(fields)).map(|a| a.span_bytes())
    }

    /// The message of a ValueError.
    fn refused<T>(result: Result<T>) -> String {
        match result {
            Err(Error::Core(CoreError::Value(msg))) => msg,
            Err(other) => panic!("not a ValueError: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    fn walked(root: &FFI_ArrowSchema) -> Result<()> {
        Seen::walk(root)
    }

    const I32: &CStr = c"i";
    /// Addresses no buffer is read at (the checks read only the pointers).
    const SOME: *const c_void = 0x1000 as *const c_void;
    const NULL: *const c_void = ptr::null();

    #[test]
    fn sound_schemas_are_read_with_their_type_and_metadata() {
        let item = |t| Arc::new(Field::new("item", t, true));
        let list = DataType::FixedSizeList(item(DataType::Float32), 3);
        let nested = DataType::FixedSizeList(item(list.clone()), 0);
        let table = DataType::Struct(Fields::from(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, true),
        ]));
        for data_type in [DataType::Int32, DataType::Boolean, list, nested, table] {
            let checked = checked_schema(&data_type);
            assert_eq!(checked.data_type(), &data_type);
            let field = checked.field();
            assert_eq!((field.name().as_str(), field.data_type()), ("", &data_type));
        }
        let tagged = Field::new("x", DataType::UInt8, true).with_metadata(HashMap::from([(
            "ARROW:extension:name".to_owned(),
            "tag".to_owned(),
        )]));
        let checked = schema(&FFI_ArrowSchema::try_from(&tagged).unwrap())
            .ok()
            .unwrap();
        assert_eq!(checked.field().metadata(), tagged.metadata());
        // A requested schema may be any type, and keeps its name.
        let text = Field::new("words", DataType::Utf8, false);
        let read = readable(&FFI_ArrowSchema::try_from(&text).unwrap())
            .ok()
            .unwrap();
        assert_eq!(
            (read.name().as_str(), read.data_type()),
            ("words", &DataType::Utf8)
        );
    }

    #[test]
    fn types_dlpack_cant_carry_are_a_type_error_naming_them() {
        for data_type in [
            DataType::Utf8,
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Utf8, true)), 2),
        ] {
            let ffi = FFI_ArrowSchema::try_from(&data_type).unwrap();
            match schema(&ffi) {
                Err(Error::Core(CoreError::Type(msg))) => assert!(
                    msg.starts_with("this Arrow array is of Arrow type Utf8, which DLPack can't"),
                    "{msg}"
                ),
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("{data_type} accepted"),
            }
        }
    }

    #[test]
    fn a_fixed_size_list_of_negative_size_is_malformed() {
        let child = forged_schema(node(I32));
        // (children arrays bound first: a schema holds a pointer to them)
        let children: [*const FFI_ArrowSchema; 1] = [&*child];
        let list = forged_schema(parent(c"+w:-3", &children));
        assert_eq!(
            refused(schema(&list)),
            "the Arrow schema is malformed: its fixed-size list has a negative size (-3)"
        );
        let empty = forged_schema(parent(c"+w:0", &children));
        assert!(schema(&empty).is_ok());
    }

    #[test]
    fn a_lying_schema_node_is_refused_naming_the_lie() {
        let released = forged_schema(SchemaFields {
            release: None,
            ..node(I32)
        });
        assert_eq!(
            refused(walked(&released)),
            "the Arrow schema is released (its release callback is NULL): it was read already, \
             perhaps imported by another consumer; ask its producer for a new one"
        );
        let cases = [
            (
                SchemaFields {
                    format: ptr::null(),
                    ..node(I32)
                },
                "its format is NULL",
            ),
            (node(c"\xff"), "its format is not UTF-8"),
            (
                SchemaFields {
                    name: c"\xfe".as_ptr(),
                    ..node(I32)
                },
                "its name is not UTF-8",
            ),
            (
                SchemaFields {
                    n_children: -1,
                    ..node(c"+s")
                },
                "its number of children is negative (-1)",
            ),
            (
                SchemaFields {
                    n_children: 2,
                    ..node(c"+s")
                },
                "it has 2 children but no children pointer",
            ),
        ];
        for (fields, why) in cases {
            let forged = forged_schema(fields);
            assert_eq!(
                refused(walked(&forged)),
                format!("the Arrow schema is malformed: {why}")
            );
        }
        // A name that is UTF-8 is read; no children need no pointer.
        let named = forged_schema(SchemaFields {
            name: c"x".as_ptr(),
            ..node(c"+s")
        });
        assert!(walked(&named).is_ok());
    }

    #[test]
    fn children_and_dictionaries_are_checked_as_nodes() {
        let sound = forged_schema(node(I32));
        let released = forged_schema(SchemaFields {
            release: None,
            ..node(I32)
        });
        let children: [*const FFI_ArrowSchema; 2] = [&*sound, ptr::null()];
        let with_null = forged_schema(parent(c"+s", &children));
        assert_eq!(
            refused(walked(&with_null)),
            "the Arrow schema is malformed: its child 1 is NULL"
        );
        let children: [*const FFI_ArrowSchema; 2] = [&*sound, &*released];
        let with_released = forged_schema(parent(c"+s", &children));
        assert!(refused(walked(&with_released)).contains("is released"));
        let with_dictionary = |dictionary: &FFI_ArrowSchema| {
            forged_schema(SchemaFields {
                dictionary,
                ..node(I32)
            })
        };
        assert!(walked(&with_dictionary(&sound)).is_ok());
        assert!(refused(walked(&with_dictionary(&released))).contains("is released"));
    }

    #[test]
    fn formats_with_children_need_them() {
        let child = forged_schema(node(I32));
        let one: [*const FFI_ArrowSchema; 1] = [&*child];
        for (format, needed) in [
            (c"+l", 1),
            (c"+L", 1),
            (c"+vl", 1),
            (c"+vL", 1),
            (c"+m", 1),
            (c"+r", 2),
            (c"+w:4", 1),
        ] {
            let short = forged_schema(parent(format, &one[..needed - 1]));
            let name = format.to_str().unwrap();
            assert_eq!(
                refused(walked(&short)),
                format!(
                    "the Arrow schema is malformed: its format {name:?} needs {needed} child \
                     type(s), it has {}",
                    needed - 1
                )
            );
        }
        let second = forged_schema(node(I32));
        let two: [*const FFI_ArrowSchema; 2] = [&*child, &*second];
        let run_ends = forged_schema(parent(c"+r", &two));
        assert!(walked(&run_ends).is_ok());
        let list = forged_schema(parent(c"+l", &one));
        assert!(walked(&list).is_ok());
        for format in [I32, c"+s", c"w:4"] {
            assert!(walked(&forged_schema(node(format))).is_ok());
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        // `levels` nodes, each the child (or dictionary) of the one before.
        fn chain(levels: usize, dictionaries: bool) -> Result<()> {
            let mut nodes: Vec<Box<FFI_ArrowSchema>> = vec![forged_schema(node(I32))];
            let mut slots: Vec<Box<[*const FFI_ArrowSchema; 1]>> = Vec::new();
            for _ in 1..levels {
                let below: *const FFI_ArrowSchema = &**nodes.last().unwrap();
                let fields = if dictionaries {
                    SchemaFields {
                        dictionary: below,
                        ..node(I32)
                    }
                } else {
                    slots.push(Box::new([below]));
                    parent(c"+s", &slots.last().unwrap()[..])
                };
                nodes.push(forged_schema(fields));
            }
            walked(nodes.last().unwrap())
        }
        for dictionaries in [false, true] {
            // the root at depth 0, the last node at MAX_DEPTH
            assert!(chain(MAX_DEPTH + 1, dictionaries).is_ok());
            assert_eq!(
                refused(chain(MAX_DEPTH + 2, dictionaries)),
                format!("the Arrow schema is malformed: nests deeper than {MAX_DEPTH} levels")
            );
        }
    }

    #[test]
    fn a_node_reached_twice_is_refused_where_it_is_reached_again() {
        let already = |what: &str| {
            format!(
                "the Arrow schema is malformed: its {what} is a schema already in the tree \
                 (shared with another parent, or its own ancestor): each node of a schema must \
                 be a struct of its own"
            )
        };
        let leaf = forged_schema(node(I32));
        let children: [*const FFI_ArrowSchema; 2] = [&*leaf, &*leaf];
        let shared = forged_schema(parent(c"+s", &children));
        assert_eq!(refused(walked(&shared)), already("child 1"));
        // The root is in the tree from the start: a cycle back to it is refused where it
        // closes (b's child 1), not a level later, where the root's child 0 would meet `a`.
        let a = forged_schema(node(I32));
        let c = forged_schema(node(I32));
        let slots = [Cell::new(&raw const *c), Cell::new(ptr::null())];
        let b = forged_schema(parent_later(c"+s", &slots));
        let root_slots: [*const FFI_ArrowSchema; 2] = [&*a, &*b];
        let root = forged_schema(parent(c"+s", &root_slots));
        slots[1].set(&*root);
        assert_eq!(refused(walked(&root)), already("child 1"));
        // A root whose only link is its dictionary is in the tree from the start as well.
        let e = forged_schema(node(I32));
        let d_slots = [Cell::new(&raw const *e), Cell::new(ptr::null())];
        let d = forged_schema(parent_later(c"+s", &d_slots));
        let root = forged_schema(SchemaFields {
            dictionary: &*d,
            ..node(I32)
        });
        d_slots[1].set(&*root);
        assert_eq!(refused(walked(&root)), already("child 1"));
    }

    #[test]
    fn sound_arrays_pass_and_span_their_buffers_bytes() {
        let i32s = DataType::Int32;
        // 4 values and their validity bitmap: 16 + 1 bytes; an offset of 8 reaches 12 values
        // and 2 bitmap bytes.
        assert_eq!(span(&i32s, fields(4, &[SOME, SOME], &[])).ok(), Some(17));
        // (each struct's arrays bound first: they must outlive it)
        let two = [SOME, SOME];
        let offset = ArrayFields {
            offset: 8,
            null_count: 3,
            ..fields(4, &two, &[])
        };
        assert_eq!(span(&i32s, offset).ok(), Some(50));
        // No bitmap spans nothing; an unknown null count (-1) needs none.
        let no_bitmap = [NULL, SOME];
        let unknown = ArrayFields {
            null_count: -1,
            ..fields(4, &no_bitmap, &[])
        };
        assert_eq!(span(&i32s, unknown).ok(), Some(16));
        // Empty: no bytes, and a NULL values buffer is fine.
        assert_eq!(span(&i32s, fields(0, &[NULL, NULL], &[])).ok(), Some(0));
        // Booleans are bits: 10 of them and their bitmap, 2 + 2 bytes.
        assert_eq!(
            span(&DataType::Boolean, fields(10, &[SOME, SOME], &[])).ok(),
            Some(4)
        );
        assert_eq!(
            span(&DataType::Float64, fields(3, &[NULL, SOME], &[])).ok(),
            Some(24)
        );
    }

    #[test]
    fn nested_arrays_span_their_childrens_bytes() {
        let item = Arc::new(Field::new("item", DataType::Int16, true));
        let list = DataType::FixedSizeList(item, 3);
        // 2 lists of 3 at offset 1: the child needs 9 values; it has exactly that many.
        let (two, one) = ([SOME, SOME], [SOME]);
        let child = forged_array(fields(9, &two, &[]));
        let children: [*const FFI_ArrowArray; 1] = [&child];
        let lists = ArrayFields {
            offset: 1,
            ..fields(2, &one, &children)
        };
        assert_eq!(span(&list, lists).ok(), Some(1 + 2 + 18));
        let table = DataType::Struct(Fields::from(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
        ]));
        let (no_bitmap, none) = ([NULL, SOME], [NULL]);
        let a = forged_array(fields(3, &no_bitmap, &[]));
        let b = forged_array(fields(5, &no_bitmap, &[]));
        let columns: [*const FFI_ArrowArray; 2] = [&a, &b];
        let rows = fields(3, &none, &columns);
        assert_eq!(span(&table, rows).ok(), Some(24 + 40));
    }

    #[test]
    fn a_lying_array_is_refused_naming_the_lie() {
        let i32s = DataType::Int32;
        let malformed = |fields: ArrayFields| {
            refused(span(&i32s, fields))
                .strip_prefix("the Arrow array is malformed: ")
                .unwrap()
                .to_owned()
        };
        let two = [SOME, SOME];
        assert!(
            refused(span(
                &i32s,
                ArrayFields {
                    release: None,
                    ..fields(4, &two, &[])
                }
            ))
            .starts_with("the Arrow array is released")
        );
        for (length, offset, null_count) in [(-1, 0, 0), (4, -1, 0), (4, 0, -2)] {
            let lie = ArrayFields {
                offset,
                null_count,
                ..fields(length, &two, &[])
            };
            assert_eq!(
                malformed(lie),
                format!(
                    "its length ({length}), offset ({offset}) or null count ({null_count}) is \
                     negative"
                )
            );
        }
        let past = ArrayFields {
            offset: i64::MAX,
            ..fields(1, &two, &[])
        };
        assert_eq!(
            malformed(past),
            format!(
                "its length (1) and offset ({}) reach past the memory this process can address",
                i64::MAX
            )
        );
        let dictionary = forged_array(fields(4, &two, &[]));
        let with_dictionary = ArrayFields {
            dictionary: &dictionary,
            ..fields(4, &two, &[])
        };
        assert_eq!(
            malformed(with_dictionary),
            "it has a dictionary its type doesn't have"
        );
        assert_eq!(
            malformed(fields(4, &[SOME, SOME, SOME], &[])),
            "it has 3 buffers and 0 children, where its type Int32 has 2 and 0"
        );
        let child = forged_array(fields(4, &two, &[]));
        assert_eq!(
            malformed(fields(4, &two, &[&child])),
            "it has 2 buffers and 1 children, where its type Int32 has 2 and 0"
        );
        assert_eq!(
            malformed(ArrayFields {
                n_buffers: -2,
                ..fields(4, &two, &[])
            }),
            "its number of buffers is negative (-2)"
        );
        assert_eq!(
            malformed(ArrayFields {
                buffers: ptr::null(),
                ..fields(4, &two, &[])
            }),
            "its buffers pointer is NULL"
        );
        assert_eq!(
            malformed(ArrayFields {
                null_count: 3,
                ..fields(4, &[NULL, SOME], &[])
            }),
            "it says it has 3 nulls but has no validity bitmap"
        );
        assert_eq!(
            malformed(fields(1, &[NULL, NULL], &[])),
            "its values buffer is NULL"
        );
    }

    #[test]
    fn buffers_must_end_inside_the_address_space() {
        let i32s = DataType::Int32;
        let at = |from_top: u64| (ADDRESS_SPACE - from_top) as *const c_void;
        let too_large = "the Arrow array is malformed: its length (4) and offset (0) reach past \
                         the memory this process can address";
        // 4 values end exactly at the top; one byte less room is too little.
        assert_eq!(
            span(&i32s, fields(4, &[ptr::null(), at(16)], &[])).ok(),
            Some(16)
        );
        assert_eq!(
            refused(span(&i32s, fields(4, &[ptr::null(), at(15)], &[]))),
            too_large
        );
        // The bitmap too: 1 byte for 4 values.
        assert!(span(&i32s, fields(4, &[at(1), SOME], &[])).is_ok());
        assert_eq!(
            refused(span(&i32s, fields(4, &[at(0), SOME], &[]))),
            too_large
        );
        // An extent that wraps around the address space.
        let wraps = usize::MAX as *const c_void;
        assert_eq!(
            refused(span(&i32s, fields(4, &[ptr::null(), wraps], &[]))),
            too_large
        );
    }

    #[test]
    fn children_must_be_there_long_enough_and_sound() {
        let item = Arc::new(Field::new("item", DataType::Int16, true));
        let list = DataType::FixedSizeList(item, 3);
        let malformed = |fields: ArrayFields| refused(span(&list, fields));
        let (two, one) = ([SOME, SOME], [SOME]);
        let short = forged_array(fields(8, &two, &[]));
        let children: [*const FFI_ArrowArray; 1] = [&short];
        let lists = ArrayFields {
            offset: 1,
            ..fields(2, &one, &children)
        };
        assert_eq!(
            malformed(lists),
            "the Arrow array is malformed: its child 0 has 8 elements where the parent's \
             length and offset need 9"
        );
        let released = forged_array(ArrayFields {
            release: None,
            ..fields(6, &two, &[])
        });
        assert!(malformed(fields(2, &[SOME], &[&released])).contains("is released"));
        let negative = forged_array(fields(-1, &two, &[]));
        assert!(malformed(fields(0, &[SOME], &[&negative])).contains("is negative"));
        assert_eq!(
            malformed(fields(2, &[SOME], &[ptr::null()])),
            "the Arrow array is malformed: its child 0 is NULL"
        );
        assert_eq!(
            malformed(ArrayFields {
                n_children: 1,
                ..fields(2, &[SOME], &[])
            }),
            "the Arrow array is malformed: its children pointer is NULL"
        );
    }
}
