//! A shared pytree's segment (`dlpack.share_tree`): one memory file holding a header, the table
//! of its leaves, the tree's structure (bytes the Python side writes and reads: opaque here) and
//! every leaf's elements, C-ordered, in the order of the table.
//!
//! ```text
//! [0, 64)          header: "DLPKTREE", format (u32), 0 (u32), sequence (u64: see seqlock),
//!                  leaves (u64), table bytes (u64), structure bytes (u64), data bytes (u64),
//!                  0 (u64)
//! [64, ..)         the table: per leaf, DLPack type code (u8), bits (u8), lanes (u16),
//!                  byte-swapped (u8), ndim (u8), 0 (u16), then its shape (i64 each)
//! then             the structure
//! [data, ..)       the leaves: data starts at the next multiple of DATA_ALIGN, and each leaf at
//!                  the next multiple of its alignment (its type's, 64 bytes at least)
//! ```
//!
//! Integers are little-endian. Where each leaf lies follows from the table and the structure's
//! length alone (`TreeLayout::plan`), so a receiver recomputes it rather than trusting offsets:
//! a table it reads is checked (`TreeLayout::decode`) to be well formed, to plan to the data
//! length the header gives, and to fit in the segment. The leaves start on a page of their own,
//! apart from the header and table, which no view of a leaf then shares a page with.

use crate::abi::DLDataType;
use crate::dtype::{DType, StoredType};
use crate::error::{Error, Result};
use crate::layout::MAX_NDIM;

pub const MAGIC: &[u8; 8] = b"DLPKTREE";
/// The layout of the segment (and the protocol its sequence follows); another is refused.
pub const FORMAT: u32 = 1;
/// Bytes of the header.
pub const HEADER: u64 = 64;
/// Where the sequence word lies in the header (8-byte aligned, as atomics need).
pub const SEQUENCE_OFFSET: usize = 16;
/// The leaves start at a multiple of this: a page, on the machines we serve.
pub const DATA_ALIGN: u64 = 4096;
/// Every leaf starts at a multiple of this at least: a cache line, and what SIMD loads and XLA
/// (which takes 64-byte aligned memory in place) like best.
pub const MIN_LEAF_ALIGN: u64 = 64;
/// Bytes of a table entry before its shape.
const ENTRY: usize = 8;

/// One leaf: its element type as stored, and its shape (C-ordered, dense).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub element: StoredType,
    pub shape: Vec<i64>,
}

impl Leaf {
    /// Bytes of its elements; an error for a shape whose size can't be counted.
    pub fn nbytes(&self) -> Result<u64> {
        let mut n = self.element.dtype.itemsize() as u64;
        for &extent in &self.shape {
            let extent = u64::try_from(extent)
                .map_err(|_| Error::value(format!("negative extent in shape {:?}", self.shape)))?;
            n = n
                .checked_mul(extent)
                .ok_or_else(|| too_large(&self.shape))?;
        }
        Ok(n)
    }

    /// Where it may start: a multiple of its type's alignment (its size, rounded up to a power
    /// of two), and of `MIN_LEAF_ALIGN`.
    pub fn align(&self) -> u64 {
        (self.element.dtype.itemsize() as u64)
            .next_power_of_two()
            .max(MIN_LEAF_ALIGN)
    }
}

#[cold]
fn too_large(shape: &[i64]) -> Error {
    Error::value(format!(
        "a leaf of shape {shape:?} holds more bytes than a segment can"
    ))
}

/// Where a leaf's elements lie: bytes from the start of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub offset: u64,
    pub nbytes: u64,
}

/// Where everything in a tree's segment lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeLayout {
    leaves: Vec<Leaf>,
    placed: Vec<Placed>,
    table_len: u64,
    structure_len: u64,
    data_offset: u64,
    data_len: u64,
}

/// What a header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub leaves: u64,
    pub table_len: u64,
    pub structure_len: u64,
    pub data_len: u64,
}

/// The error of a segment that is not one of ours, or was damaged.
#[cold]
pub fn malformed(why: impl std::fmt::Display) -> Error {
    Error::value(format!("not a dlpack shared tree ({why})"))
}

fn align_up(n: u64, align: u64) -> Option<u64> {
    n.checked_next_multiple_of(align)
}

impl TreeLayout {
    /// The layout of `leaves` (in order) and a structure of `structure_len` bytes. Sizes that
    /// don't fit in 63 bits (where views address their bytes) are a `MemoryError`.
    pub fn plan(leaves: Vec<Leaf>, structure_len: u64) -> Result<TreeLayout> {
        let overflow = || {
            Error::memory(format!(
                "a tree of {} leaves this large can't be shared: its segment would hold more \
                 than 2**63 bytes",
                leaves.len()
            ))
        };
        let mut table_len = 0u64;
        for leaf in &leaves {
            if element(leaf.element.dtype.0, leaf.element.swapped).is_none() {
                return Err(Error::buffer(format!(
                    "elements of type {}{} can't be shared (the receiving side could not name \
                     them)",
                    leaf.element.dtype.name(),
                    if leaf.element.swapped {
                        " in the other byte order"
                    } else {
                        ""
                    }
                )));
            }
            if leaf.shape.len() > MAX_NDIM {
                return Err(Error::value(format!(
                    "a leaf of {} dimensions can't be shared (at most {MAX_NDIM})",
                    leaf.shape.len()
                )));
            }
            table_len += (ENTRY + 8 * leaf.shape.len()) as u64;
        }
        let data_offset = HEADER
            .checked_add(table_len)
            .and_then(|n| n.checked_add(structure_len))
            .and_then(|n| align_up(n, DATA_ALIGN))
            .ok_or_else(overflow)?;
        let mut end = data_offset;
        let mut placed = Vec::with_capacity(leaves.len());
        for leaf in &leaves {
            let nbytes = leaf.nbytes()?;
            let offset = align_up(end, leaf.align()).ok_or_else(overflow)?;
            end = offset.checked_add(nbytes).ok_or_else(overflow)?;
            placed.push(Placed { offset, nbytes });
        }
        if end > i64::MAX as u64 {
            return Err(overflow());
        }
        Ok(TreeLayout {
            leaves,
            placed,
            table_len,
            structure_len,
            data_offset,
            data_len: end - data_offset,
        })
    }

    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }

    pub fn placed(&self) -> &[Placed] {
        &self.placed
    }

    /// Bytes from the start of the segment to the end of the last leaf.
    pub fn size(&self) -> u64 {
        self.data_offset + self.data_len
    }

    /// Where the leaves start, and how many bytes they span (gaps of alignment included).
    pub fn data(&self) -> (u64, u64) {
        (self.data_offset, self.data_len)
    }

    /// Where the structure lies, and its length.
    pub fn structure(&self) -> (u64, u64) {
        (HEADER + self.table_len, self.structure_len)
    }

    /// The header, its sequence 0 (no write under way, generation 0).
    pub fn header(&self) -> [u8; HEADER as usize] {
        let mut out = [0u8; HEADER as usize];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&FORMAT.to_le_bytes());
        let words = [
            self.leaves.len() as u64,
            self.table_len,
            self.structure_len,
            self.data_len,
        ];
        for (k, word) in words.iter().enumerate() {
            out[24 + 8 * k..32 + 8 * k].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The table of leaves, as it lies at `HEADER`.
    pub fn table(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.table_len as usize);
        for leaf in &self.leaves {
            let dt = leaf.element.dtype.0;
            out.push(dt.code);
            out.push(dt.bits);
            out.extend_from_slice(&dt.lanes.to_le_bytes());
            out.push(u8::from(leaf.element.swapped));
            out.push(leaf.shape.len() as u8); // at most MAX_NDIM (`plan` checked)
            out.extend_from_slice(&[0, 0]);
            for n in &leaf.shape {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }

    /// The layout a header and the table it announces (`table`, `header.table_len` bytes)
    /// describe, checked to be well formed and to fit in `capacity` bytes.
    pub fn decode(header: &Header, table: &[u8], capacity: u64) -> Result<TreeLayout> {
        if table.len() as u64 != header.table_len {
            return Err(malformed("its table is cut short"));
        }
        let mut rest = table;
        let mut leaves = Vec::new();
        while let Some((entry, after)) = rest.split_first_chunk::<ENTRY>() {
            let [code, bits, lanes0, lanes1, swapped, ndim, pad0, pad1] = *entry;
            let dtype = DLDataType {
                code,
                bits,
                lanes: u16::from_le_bytes([lanes0, lanes1]),
            };
            let ndim = usize::from(ndim);
            if swapped > 1 || pad0 != 0 || pad1 != 0 || ndim > MAX_NDIM {
                return Err(malformed("a malformed table entry"));
            }
            let element = element(dtype, swapped == 1)
                .ok_or_else(|| malformed(format!("an element type it can't name {dtype:?}")))?;
            let Some((dims, after)) = after.split_at_checked(8 * ndim) else {
                return Err(malformed("its table is cut short"));
            };
            let shape: Vec<i64> = dims
                .chunks_exact(8)
                .map(|n| i64::from_le_bytes(n.try_into().expect("8 bytes")))
                .collect();
            if shape.iter().any(|&n| n < 0) {
                return Err(malformed("a negative extent"));
            }
            leaves.push(Leaf { element, shape });
            rest = after;
        }
        if !rest.is_empty() || leaves.len() as u64 != header.leaves {
            return Err(malformed(
                "its table does not hold the leaves its header counts",
            ));
        }
        let layout = TreeLayout::plan(leaves, header.structure_len)
            .map_err(|err| malformed(err.message()))?;
        if layout.data_len != header.data_len {
            return Err(malformed(format!(
                "its leaves span {} bytes, its header says {}",
                layout.data_len, header.data_len
            )));
        }
        if layout.size() > capacity {
            return Err(malformed(format!(
                "it needs {} bytes, its segment holds {capacity}",
                layout.size()
            )));
        }
        Ok(layout)
    }
}

impl Header {
    /// What the first `HEADER` bytes of a segment say, checked to be a header of ours.
    pub fn decode(bytes: &[u8; HEADER as usize]) -> Result<Header> {
        if &bytes[..8] != MAGIC {
            return Err(malformed("its header does not start as one does"));
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let format = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if format != FORMAT {
            return Err(malformed(format!(
                "format {format}, this dlpack reads format {FORMAT}"
            )));
        }
        Ok(Header {
            leaves: word(24),
            table_len: word(32),
            structure_len: word(40),
            data_len: word(48),
        })
    }
}

/// The element type a table names, if it is one a leaf can hold (a named type, swapped only
/// where it has a byte order, as the array interface spells types: bytes and raw `V` types
/// have none).
pub fn element(dtype: DLDataType, swapped: bool) -> Option<StoredType> {
    let dtype = DType::from_dlpack(dtype).ok()?;
    if !DType::named().any(|(_, named)| named == dtype) {
        return None;
    }
    let has_order = dtype.itemsize() > 1 && dtype.typekind() != b'V';
    (has_order || !swapped).then_some(StoredType { dtype, swapped })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn leaf() -> impl Strategy<Value = Leaf> {
        let named: Vec<DType> = DType::named().map(|(_, dtype)| dtype).collect();
        (
            proptest::sample::select(named),
            any::<bool>(),
            proptest::collection::vec(0..6i64, 0..4),
        )
            .prop_map(|(dtype, swapped, shape)| Leaf {
                element: element(dtype.0, swapped).unwrap_or(StoredType {
                    dtype,
                    swapped: false,
                }),
                shape,
            })
    }

    fn layout() -> impl Strategy<Value = TreeLayout> {
        (proptest::collection::vec(leaf(), 0..12), 0..10_000u64)
            .prop_map(|(leaves, structure)| TreeLayout::plan(leaves, structure).unwrap())
    }

    /// The header and table, and the layout read back from them.
    fn read_back(layout: &TreeLayout, capacity: u64) -> Result<TreeLayout> {
        let header = Header::decode(&layout.header())?;
        TreeLayout::decode(&header, &layout.table(), capacity)
    }

    proptest! {
        #[test]
        fn leaves_are_aligned_in_order_apart_and_past_the_structure(layout in layout()) {
            let (structure, structure_len) = layout.structure();
            prop_assert_eq!(structure, HEADER + layout.table().len() as u64);
            let (data, data_len) = layout.data();
            prop_assert!(data % DATA_ALIGN == 0 && data >= structure + structure_len);
            let mut end = data;
            for (leaf, placed) in layout.leaves().iter().zip(layout.placed()) {
                let itemsize = leaf.element.dtype.itemsize() as u64;
                prop_assert!(placed.offset % MIN_LEAF_ALIGN == 0);
                prop_assert!(placed.offset % itemsize.next_power_of_two() == 0);
                prop_assert!(placed.offset >= end); // after the one before, never overlapping
                // No more padding than alignment asks.
                prop_assert!(placed.offset - end < leaf.align());
                let numel: i64 = leaf.shape.iter().product();
                prop_assert_eq!(placed.nbytes, numel as u64 * itemsize);
                end = placed.offset + placed.nbytes;
            }
            prop_assert_eq!(data + data_len, end);
            prop_assert_eq!(layout.size(), end);
        }

        #[test]
        fn layouts_read_back_as_written(layout in layout()) {
            prop_assert_eq!(read_back(&layout, layout.size()).unwrap(), layout);
        }

        #[test]
        fn a_segment_too_small_is_refused(layout in layout(), short in 1..4096u64) {
            let capacity = layout.size().saturating_sub(short);
            prop_assert!(matches!(read_back(&layout, capacity), Err(Error::Value(_))));
        }

        #[test]
        fn cut_or_extended_tables_are_refused(
            layout in layout(), cut in any::<prop::sample::Index>(),
        ) {
            let header = Header::decode(&layout.header()).unwrap();
            let table = layout.table();
            let short = &table[..cut.index(table.len().max(1)).min(table.len())];
            if short.len() < table.len() {
                let header = Header { table_len: short.len() as u64, ..header };
                prop_assert!(TreeLayout::decode(&header, short, u64::MAX).is_err());
            }
            let mut long = table.clone();
            long.extend_from_slice(&[0; ENTRY]);
            let header = Header { table_len: long.len() as u64, ..header };
            prop_assert!(TreeLayout::decode(&header, &long, u64::MAX).is_err());
        }

        #[test]
        fn any_bytes_decode_or_are_refused(
            header in proptest::collection::vec(any::<u8>(), HEADER as usize),
            table in proptest::collection::vec(any::<u8>(), 0..200),
            capacity in any::<u64>(),
        ) {
            // Never a panic; what decodes fits and says the same again.
            let mut header: [u8; HEADER as usize] = header.try_into().unwrap();
            header[..8].copy_from_slice(MAGIC);
            header[8..12].copy_from_slice(&FORMAT.to_le_bytes());
            let Ok(read) = Header::decode(&header) else { return Ok(()) };
            let read = Header { table_len: table.len() as u64, ..read };
            if let Ok(layout) = TreeLayout::decode(&read, &table, capacity) {
                prop_assert!(layout.size() <= capacity);
                prop_assert_eq!(layout.table(), table);
            }
        }

        #[test]
        fn any_flipped_table_byte_is_refused_or_reads_as_a_layout(
            layout in layout(), at in any::<prop::sample::Index>(), xor in 1..=255u8,
        ) {
            let header = Header::decode(&layout.header()).unwrap();
            let mut table = layout.table();
            if table.is_empty() {
                return Ok(());
            }
            let at = at.index(table.len());
            table[at] ^= xor;
            if let Ok(read) = TreeLayout::decode(&header, &table, u64::MAX) {
                prop_assert_eq!(read.table(), table);
                prop_assert_eq!(read.data().1, layout.data().1);
            }
        }
    }

    fn float32(shape: Vec<i64>) -> Leaf {
        Leaf {
            element: StoredType {
                dtype: DType::from_name("float32").unwrap(),
                swapped: false,
            },
            shape,
        }
    }

    #[test]
    fn a_thousand_vectors() {
        let leaves = vec![float32(vec![1024]); 1000];
        let layout = TreeLayout::plan(leaves, 20_000).unwrap();
        assert_eq!(layout.table().len(), 16_000);
        let (data, len) = layout.data();
        assert_eq!(data, 36_864); // 64 + 16,000 + 20,000, rounded up to a page
        assert_eq!(len, 4_096_000); // 4 KiB leaves need no padding
        assert_eq!(layout.placed()[1].offset, data + 4096);
    }

    #[test]
    fn sizes_that_overflow_are_refused() {
        let huge = float32(vec![1 << 61]);
        assert!(matches!(
            TreeLayout::plan(vec![huge.clone()], 0),
            Err(Error::Memory(_))
        ));
        assert!(matches!(
            TreeLayout::plan(vec![float32(vec![1 << 40, 1 << 40])], 0),
            Err(Error::Value(_))
        ));
        assert!(matches!(
            TreeLayout::plan(vec![float32(vec![1]); 2], u64::MAX - 100),
            Err(Error::Memory(_))
        ));
        assert!(TreeLayout::plan(vec![float32(vec![1; MAX_NDIM + 1])], 0).is_err());
        assert!(TreeLayout::plan(vec![float32(vec![-1])], 0).is_err());
    }

    #[test]
    fn headers_of_others_are_refused() {
        let layout = TreeLayout::plan(vec![float32(vec![3])], 10).unwrap();
        let mut header = layout.header();
        header[8] = 2;
        let err = Header::decode(&header).unwrap_err();
        assert!(
            err.message()
                .contains("format 2, this dlpack reads format 1")
        );
        header[0] = b'X';
        assert!(
            Header::decode(&header)
                .unwrap_err()
                .message()
                .contains("does not start")
        );
        // Another data length than its table plans to.
        let mut read = Header::decode(&layout.header()).unwrap();
        read.data_len += 64;
        let err = TreeLayout::decode(&read, &layout.table(), u64::MAX).unwrap_err();
        assert!(err.message().contains("header says"), "{err:?}");
        // A type only a byte-ordered type may carry swapped.
        let bools = Leaf {
            element: StoredType {
                dtype: DType::from_name("bool").unwrap(),
                swapped: true,
            },
            shape: vec![2],
        };
        let err = TreeLayout::plan(vec![bools.clone()], 0).unwrap_err();
        assert!(matches!(err, Error::Buffer(m) if m.contains("bool in the other byte order")));
        let layout = TreeLayout::plan(vec![float32(vec![2])], 0).unwrap();
        let mut table = layout.table();
        table[..2].copy_from_slice(&[bools.element.dtype.0.code, 8]);
        table[4] = 1;
        let read = Header::decode(&layout.header()).unwrap();
        let read = Header {
            data_len: 2,
            ..read
        };
        let err = TreeLayout::decode(&read, &table, u64::MAX).unwrap_err();
        assert!(err.message().contains("can't name"), "{err:?}");
    }
}
