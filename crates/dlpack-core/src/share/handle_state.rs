//! A shared-memory handle's pickled state: what a receiver needs to find, check and open the
//! memory a handle names, as one short run of bytes, so that pickling a handle makes one
//! `bytes` object and unpickling reads it in one call (nested tuples of ints and strings cost
//! more to build, pickle and check than everything else a handle does).
//!
//! ```text
//! "DLSH", format (u8)
//! boot id (16 bytes), producer pid (i32), writable (u8, 0 or 1), memory (u8):
//!   0  no elements: nothing follows until the layout
//!   1  host segment: lender id (u64), board descriptor (i32), token (16 bytes),
//!      file device (u64), inode (u64), size (u64), generation (u64), descriptor lent (i32)
//! layout: offset (i64), DLPack type code (u8), bits (u8), lanes (u16), byte-swapped (u8),
//!         ndim (u8), shape (i64 each), byte strides (i64 each)
//! ```
//!
//! Integers are little-endian. `decode` checks the structure only (lengths, flags, ndim,
//! non-negative extents); what the fields mean (the type, the layout against the segment, the
//! token) is the receiver's to check.

use std::sync::OnceLock;

use super::memfd::FileId;
use super::system;
use crate::abi::DLDataType;
use crate::error::{Error, Result};
use crate::layout::MAX_NDIM;

/// The layout of the state (and the protocol its segment's locks follow); a state of another
/// format is refused, not misread.
pub const FORMAT: u8 = 3;
const MAGIC: &[u8; 4] = b"DLSH";

/// Bytes of a lender's token.
pub const TOKEN_BYTES: usize = 16;
pub type Token = [u8; TOKEN_BYTES];

/// A handle's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandleState {
    /// The boot id of the machine it was made on.
    pub boot_id: [u8; 16],
    /// The process that made it.
    pub pid: i32,
    /// Whether receivers may write.
    pub writable: bool,
    /// The segment it names, `None` for no elements.
    pub lent: Option<Lent>,
    /// Where the elements start, in bytes into the segment.
    pub offset: i64,
    /// The element type as stored (unchecked), and whether its bytes are swapped.
    pub dtype: DLDataType,
    pub swapped: bool,
    pub shape: Vec<i64>,
    /// In bytes.
    pub strides: Vec<i64>,
}

/// The segment a handle names, and where its lender is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lent {
    /// The lender's random id and its board's descriptor in the producer.
    pub lender: u64,
    pub board_fd: i32,
    pub token: Token,
    pub file: FileId,
    pub size: u64,
    pub generation: u64,
    /// The number of the descriptor lent, in the producer.
    pub fd: i32,
}

/// The error of a state that is not one of ours.
#[cold]
pub fn malformed(why: impl std::fmt::Display) -> Error {
    Error::value(format!("not a dlpack shared-memory handle ({why})"))
}

impl HandleState {
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(FORMAT)
    }

    /// The state as `format` would spell it if its fields were these (tests of refusals).
    pub fn encode_as(&self, format: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + 16 * self.shape.len());
        out.extend_from_slice(MAGIC);
        out.push(format);
        out.extend_from_slice(&self.boot_id);
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.push(u8::from(self.writable));
        match &self.lent {
            None => out.push(0),
            Some(lent) => {
                out.push(1);
                out.extend_from_slice(&lent.lender.to_le_bytes());
                out.extend_from_slice(&lent.board_fd.to_le_bytes());
                out.extend_from_slice(&lent.token);
                out.extend_from_slice(&lent.file.dev.to_le_bytes());
                out.extend_from_slice(&lent.file.ino.to_le_bytes());
                out.extend_from_slice(&lent.size.to_le_bytes());
                out.extend_from_slice(&lent.generation.to_le_bytes());
                out.extend_from_slice(&lent.fd.to_le_bytes());
            }
        }
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.push(self.dtype.code);
        out.push(self.dtype.bits);
        out.extend_from_slice(&self.dtype.lanes.to_le_bytes());
        out.push(u8::from(self.swapped));
        // A layout has at most MAX_NDIM dimensions; more would be refused where it arrives.
        out.push(u8::try_from(self.shape.len()).unwrap_or(u8::MAX));
        for n in self.shape.iter().chain(&self.strides) {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    }

    /// The state `bytes` spell, checked to be well formed (see the module doc).
    pub fn decode(bytes: &[u8]) -> Result<HandleState> {
        let mut r = Reader(bytes);
        if r.take::<4>() != Some(*MAGIC) {
            return Err(malformed("its state does not start as one does"));
        }
        let format = r.u8().ok_or_else(|| malformed("its state is cut short"))?;
        if format != FORMAT {
            return Err(malformed(format!(
                "format {format}, this dlpack reads format {FORMAT}"
            )));
        }
        let state = Self::fields(&mut r).ok_or_else(|| malformed("a malformed state"))?;
        if !r.0.is_empty() {
            return Err(malformed("its state has bytes past its end"));
        }
        Ok(state)
    }

    fn fields(r: &mut Reader<'_>) -> Option<HandleState> {
        let boot_id = r.take()?;
        let pid = i32::from_le_bytes(r.take()?);
        let writable = r.flag()?;
        let lent = match r.u8()? {
            0 => None,
            1 => Some(Lent {
                lender: r.u64()?,
                board_fd: i32::from_le_bytes(r.take()?),
                token: r.take()?,
                file: FileId {
                    dev: r.u64()?,
                    ino: r.u64()?,
                },
                size: r.u64()?,
                generation: r.u64()?,
                fd: i32::from_le_bytes(r.take()?),
            }),
            _ => return None,
        };
        let offset = i64::from_le_bytes(r.take()?);
        let dtype = DLDataType {
            code: r.u8()?,
            bits: r.u8()?,
            lanes: u16::from_le_bytes(r.take()?),
        };
        let swapped = r.flag()?;
        let ndim = usize::from(r.u8()?);
        if ndim > MAX_NDIM {
            return None;
        }
        let mut dims = (0..2 * ndim).map(|_| r.take().map(i64::from_le_bytes));
        let shape: Vec<i64> = dims.by_ref().take(ndim).collect::<Option<_>>()?;
        let strides: Vec<i64> = dims.collect::<Option<_>>()?;
        if shape.iter().any(|&n| n < 0) {
            return None;
        }
        Some(HandleState {
            boot_id,
            pid,
            writable,
            lent,
            offset,
            dtype,
            swapped,
            shape,
            strides,
        })
    }
}

/// The unread rest of a state.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    /// A byte that is 0 or 1.
    fn flag(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
}

/// This machine's boot id (see `system::boot_id`) as 16 bytes (read once).
pub fn boot_id() -> Result<[u8; 16]> {
    static BYTES: OnceLock<[u8; 16]> = OnceLock::new();
    if let Some(bytes) = BYTES.get() {
        return Ok(*bytes);
    }
    let text = system::boot_id()?;
    let bytes = boot_id_bytes(text)
        .ok_or_else(|| Error::buffer(format!("the kernel's boot id {text:?} is not a uuid")))?;
    Ok(*BYTES.get_or_init(|| bytes))
}

/// A boot id's 16 bytes, from its text (hex digits, with or without dashes).
pub fn boot_id_bytes(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// A boot id's text, as the kernel writes it (8-4-4-4-12 lowercase hex digits).
pub fn boot_id_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn lent() -> impl Strategy<Value = Option<Lent>> {
        proptest::option::of(
            (
                any::<(u64, i32, Token)>(),
                any::<(u64, u64, u64, u64, i32)>(),
            )
                .prop_map(
                    |((lender, board_fd, token), (dev, ino, size, generation, fd))| Lent {
                        lender,
                        board_fd,
                        token,
                        file: FileId { dev, ino },
                        size,
                        generation,
                        fd,
                    },
                ),
        )
    }

    fn state() -> impl Strategy<Value = HandleState> {
        (
            any::<([u8; 16], i32, bool, i64, (u8, u8, u16), bool)>(),
            lent(),
            proptest::collection::vec((0..i64::MAX, any::<i64>()), 0..=MAX_NDIM),
        )
            .prop_map(
                |((boot_id, pid, writable, offset, (code, bits, lanes), swapped), lent, dims)| {
                    HandleState {
                        boot_id,
                        pid,
                        writable,
                        lent,
                        offset,
                        dtype: DLDataType { code, bits, lanes },
                        swapped,
                        shape: dims.iter().map(|d| d.0).collect(),
                        strides: dims.iter().map(|d| d.1).collect(),
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn states_read_back_as_written(state in state()) {
            let bytes = state.encode();
            prop_assert_eq!(HandleState::decode(&bytes).unwrap(), state);
        }

        #[test]
        fn cut_or_extended_states_are_refused(state in state(), cut in any::<prop::sample::Index>()) {
            let bytes = state.encode();
            let short = &bytes[..cut.index(bytes.len())];
            prop_assert!(matches!(HandleState::decode(short), Err(Error::Value(_))));
            let mut long = bytes.clone();
            long.push(0);
            prop_assert!(matches!(HandleState::decode(&long), Err(Error::Value(_))));
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            // Never a panic; when they decode, they say the same again.
            if let Ok(state) = HandleState::decode(&bytes) {
                prop_assert_eq!(state.encode(), bytes);
            }
        }

        #[test]
        fn any_flipped_byte_is_refused_or_reads_as_a_state(
            state in state(), at in any::<prop::sample::Index>(), xor in 1..=255u8,
        ) {
            let mut bytes = state.encode();
            let at = at.index(bytes.len());
            bytes[at] ^= xor;
            if let Ok(read) = HandleState::decode(&bytes) {
                prop_assert_eq!(read.encode(), bytes);
            }
        }
    }

    #[test]
    fn other_formats_and_flags_are_refused() {
        let state = HandleState {
            boot_id: [7; 16],
            pid: 12,
            writable: false,
            lent: None,
            offset: 0,
            dtype: DLDataType {
                code: 2,
                bits: 32,
                lanes: 1,
            },
            swapped: false,
            shape: vec![3],
            strides: vec![4],
        };
        let bytes = state.encode();
        let refused = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = bytes.clone();
            edit(&mut bytes);
            match HandleState::decode(&bytes) {
                Err(Error::Value(msg)) => msg,
                other => panic!("{other:?}"),
            }
        };
        assert!(refused(&|b| b[4] = 2).contains("format 2, this dlpack reads format 3"));
        assert!(refused(&|b| b[0] = b'X').contains("does not start"));
        assert!(refused(&|b| b[25] = 2).contains("malformed")); // writable
        assert!(refused(&|b| b[26] = 2).contains("malformed")); // memory kind
        let negative = HandleState {
            shape: vec![-1],
            ..state.clone()
        };
        assert!(HandleState::decode(&negative.encode()).is_err());
        let deep = HandleState {
            shape: vec![1; MAX_NDIM + 1],
            strides: vec![1; MAX_NDIM + 1],
            ..state
        };
        assert!(HandleState::decode(&deep.encode()).is_err());
    }

    #[test]
    fn boot_ids_read_back() {
        let text = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        let bytes = boot_id_bytes(text).unwrap();
        assert_eq!(bytes[0], 0x0f);
        assert_eq!(boot_id_text(&bytes), text);
        assert_eq!(boot_id_bytes("0f1e"), None);
        assert_eq!(boot_id_bytes(&"g".repeat(32)), None);
    }
}
