//! Lending the segments that handles name to the processes that receive them.
//!
//! Pickling a handle pins its segment in this process's lender under a fresh token, so the
//! memory outlives the handle until a receiver has it (a pickle never opened keeps its segment
//! until this process exits, as `multiprocessing`'s own descriptor passing does). The lender is
//! a thread serving a Unix socket at an abstract address named after the process and a random
//! id (so it vanishes with the process, and a later process with the same pid can't answer for
//! it), with a release board (`board`); only processes of the same user are served, and it
//! never needs Python. A receiver (`client`), once it has the segment (mapped already, or
//! opened straight from this process's descriptor table through /proc, the handle naming the
//! descriptor lent), releases the token on the board; where /proc won't serve, it claims the
//! token on the socket first and gets the segment's descriptor (`SCM_RIGHTS`), and releases by
//! message.
//!
//! The pin lasts until the release, which comes after the receiver holds its lock on the
//! segment: until then, the segment must be neither freed nor reused. Releases on the board are
//! read when the lender next looks (`sweep`): when it answers a claim, counts, when a mapping of
//! this process dies (so that a segment nothing else holds goes at once), before a fresh copy
//! looks for a segment to reuse, and once a second while tokens are pinned.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

use super::board::{Board, SLOTS};
use super::per_process::PerProcess;
use super::segment::Segment;
use dlpack_core::error::{Error, Result};
use dlpack_core::share::{Listener, Stream, system};

// A token (`TOKEN_BYTES`): its word on the board (`u32`, little-endian; `NO_SLOT` for none), the
// nonce written there (`u64`, not 0), and four random bytes.
pub use dlpack_core::share::handle_state::{TOKEN_BYTES, Token};
const NO_SLOT: u32 = u32::MAX;

/// The board word and nonce a token names (`None` for a token without a word).
pub fn slot_of(token: &[u8]) -> Option<(u32, u64)> {
    let slot = u32::from_le_bytes(token.get(..4)?.try_into().ok()?);
    let nonce = u64::from_le_bytes(token.get(4..12)?.try_into().ok()?);
    (slot != NO_SLOT && nonce != 0).then_some((slot, nonce))
}

/// The bit of a token's nonce that says it was lent writable.
const WRITABLE_BIT: u64 = 2;

/// Whether `token` was lent writable (as its lender wrote it), if it is a token at all: a
/// receiver refuses a handle whose state asks for more than that before opening anything, on
/// every path (the lender checks its pin on a claim; /proc would open any mode the file allows).
pub fn lent_writable(token: &[u8]) -> Option<bool> {
    let nonce = u64::from_le_bytes(token.get(4..12)?.try_into().ok()?);
    (nonce & 1 == 1).then_some(nonce & WRITABLE_BIT != 0)
}

/// A receiver's requests, each followed by a token, and the lender's answers.
pub const CLAIM: u8 = b'C';
pub const RELEASE: u8 = b'R';
pub const GRANTED: u8 = b'K';
pub const REFUSED: u8 = b'E';

/// How long either side waits for the other: a process holding the GIL in a long computation
/// delays its answers, but one that never answers must not hang the other.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the lender reads its board while tokens are pinned.
const SWEEP_EVERY: Timespec = Timespec {
    tv_sec: 1,
    tv_nsec: 0,
};

/// What a claim of a token that is not pinned is told.
const NOT_PINNED: &str = "this handle was already opened from its pickle and its memory is no \
                          longer shared, or it was not made by this process";

/// Where a lender is: its process, its random id, and its board's descriptor there. Its socket's
/// abstract name spells them (`name`), so a later process with the same pid can't answer for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Address {
    pub pid: i32,
    pub id: u64,
    pub board_fd: i32,
}

impl Address {
    /// The abstract socket name (after its NUL).
    pub fn name(&self) -> String {
        format!(
            "dlpack-share/{}/{:016x}/{}",
            self.pid, self.id, self.board_fd
        )
    }
}

pub struct Lender {
    /// Where receivers reach it, as handles carry it.
    address: Address,
    board: Board,
    pins: Mutex<Pins>,
    /// The numbers of its sockets and board, for a forked child to close its copies.
    descriptors: Mutex<Vec<RawFd>>,
}

struct Pins {
    by_token: HashMap<Token, Pin>,
    /// Board words not in use.
    free: Vec<u32>,
    /// The board's count of releases when the lender last looked at it.
    releases_seen: u64,
    /// Random bytes for tokens, drawn from the kernel a few hundred at a time.
    random: Vec<u8>,
}

/// What a token lends: the segment (alive until released), and which of its descriptors.
struct Pin {
    segment: Arc<Segment>,
    writable: bool,
    slot: Option<(u32, u64)>,
}

impl Pins {
    /// Sixteen random bytes.
    fn random_token(&mut self) -> Result<Token> {
        if self.random.len() < TOKEN_BYTES {
            self.random = system::random::<512>()?.to_vec();
        }
        let at = self.random.len() - TOKEN_BYTES;
        let token = self.random[at..].try_into().expect("16 bytes");
        self.random.truncate(at);
        Ok(token)
    }

    /// Unpin `token`, freeing its word.
    fn remove(&mut self, token: &[u8], board: &Board) -> Option<Pin> {
        let pin = self.by_token.remove(token)?;
        if let Some((slot, _)) = pin.slot {
            board.clear(slot);
            self.free.push(slot);
        }
        Some(pin)
    }

    /// Whether `pin` was released on the board.
    fn released(pin: &Pin, board: &Board) -> bool {
        pin.slot
            .is_some_and(|(slot, nonce)| !board.holds(slot, nonce))
    }
}

static LENDER: PerProcess<Option<Arc<Lender>>> = PerProcess::new(|| None);

/// Pin `segment` for a handle (writable or not) under a new token: the lender, the token, and
/// the number of the descriptor lent (receivers open it through /proc when they can).
pub fn lend(segment: Arc<Segment>, writable: bool) -> Result<(Arc<Lender>, Token, RawFd)> {
    let lender = started()?;
    let fd = segment.fd_for(writable)?.as_raw_fd();
    // Out of board words: the words released since the lender last looked are free again.
    // Without this, a fast sender would have its tokens released by message (a wake-up of this
    // process's lender thread per handle) until the next timed look.
    if lender.pins().free.is_empty() {
        lender.sweep();
    }
    let mut pins = lender.pins();
    let mut token = pins.random_token()?;
    // Never 0 (a free word); its second bit says whether it was lent writable.
    let nonce = (u64::from_le_bytes(token[4..12].try_into().expect("8 bytes")) & !WRITABLE_BIT)
        | 1
        | if writable { WRITABLE_BIT } else { 0 };
    token[4..12].copy_from_slice(&nonce.to_le_bytes());
    let slot = pins.free.pop();
    token[..4].copy_from_slice(&slot.unwrap_or(NO_SLOT).to_le_bytes());
    if let Some(slot) = slot {
        lender.board.pin(slot, nonce);
    }
    let pin = Pin {
        segment,
        writable,
        slot: slot.map(|slot| (slot, nonce)),
    };
    pins.by_token.insert(token, pin);
    drop(pins);
    Ok((lender, token, fd))
}

/// This process's lender, if it started.
pub fn own() -> Option<Arc<Lender>> {
    LENDER.lock().clone()
}

/// Let go of what tokens released on the board pinned (if this process lends).
pub fn sweep() {
    if let Some(lender) = own() {
        lender.sweep();
    }
}

/// How many tokens are pinned here.
pub fn pinned() -> usize {
    own().map_or(0, |lender| {
        lender.sweep();
        lender.pins().by_token.len()
    })
}

impl Lender {
    pub fn address(&self) -> Address {
        self.address
    }

    /// Unpin `token`: its segment, if it was pinned and not released.
    pub fn take(&self, token: &[u8]) -> Option<Arc<Segment>> {
        let (pin, released) = {
            let mut pins = self.pins();
            let released = Pins::released(pins.by_token.get(token)?, &self.board);
            (pins.remove(token, &self.board)?, released)
        };
        (!released).then_some(pin.segment)
    }

    /// Unpin the tokens released on the board (their segments let go of outside the lock): a
    /// look at its count of releases, and at its words only when that changed.
    pub fn sweep(&self) {
        let released: Vec<Pin> = {
            let mut pins = self.pins();
            let releases = self.board.releases();
            if releases == pins.releases_seen {
                return;
            }
            pins.releases_seen = releases;
            let tokens: Vec<Token> = pins
                .by_token
                .iter()
                .filter(|(_, pin)| Pins::released(pin, &self.board))
                .map(|(token, _)| *token)
                .collect();
            tokens
                .iter()
                .filter_map(|token| pins.remove(token, &self.board))
                .collect()
        };
        drop(released);
    }

    fn pins(&self) -> MutexGuard<'_, Pins> {
        self.pins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn descriptors(&self) -> MutexGuard<'_, Vec<RawFd>> {
        self.descriptors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn started() -> Result<Arc<Lender>> {
    let mut slot = LENDER.lock();
    if let Some(lender) = &*slot {
        return Ok(lender.clone());
    }
    let id = u64::from_le_bytes(system::random()?);
    let board = Board::create(id)?;
    let address = Address {
        pid: system::pid(),
        id,
        board_fd: board.fd().as_raw_fd(),
    };
    let listener = Listener::bind(address.name().as_bytes())?;
    let descriptors = vec![listener.fd().as_raw_fd(), board.fd().as_raw_fd()];
    let lender = Arc::new(Lender {
        address,
        board,
        pins: Mutex::new(Pins {
            by_token: HashMap::new(),
            free: (0..SLOTS).rev().collect(),
            releases_seen: 0,
            random: Vec::new(),
        }),
        descriptors: Mutex::new(descriptors),
    });
    let reserve = Reserve::take(&lender, &listener);
    let serving = lender.clone();
    std::thread::Builder::new()
        .name("dlpack-share-lender".into())
        .spawn(move || serve(&serving, &listener, reserve))
        .map_err(|err| Error::buffer(format!("can't start the lender thread: {err}")))?;
    *slot = Some(lender.clone());
    Ok(lender)
}

/// The lender's thread: accept connections, answer claims, take releases, read the board while
/// tokens are pinned, forever (it ends with the process).
fn serve(lender: &Lender, listener: &Listener, mut reserve: Reserve) {
    let mut connections: Vec<Stream> = Vec::new();
    // Whether the listener is left out of the next poll (see `accept`).
    let mut backing_off = false;
    loop {
        WAKEUPS.fetch_add(1, Ordering::Relaxed);
        let pinned = !lender.pins().by_token.is_empty();
        let timeout = (pinned || backing_off).then_some(&SWEEP_EVERY);
        let listening = !std::mem::take(&mut backing_off);
        let ready: Vec<(usize, bool)> = {
            let mut fds: Vec<PollFd<'_>> = std::iter::once(listener.fd())
                .chain(connections.iter().map(Stream::fd))
                .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
                .collect();
            let polled = if listening {
                &mut fds[..]
            } else {
                &mut fds[1..]
            };
            if poll(polled, timeout).is_err() {
                continue; // interrupted
            }
            fds.iter()
                .enumerate()
                .filter(|(k, fd)| (*k > 0 || listening) && !fd.revents().is_empty())
                .map(|(k, fd)| (k, fd.revents().intersects(PollFlags::IN)))
                .collect()
        };
        lender.sweep();
        // Later connections first, so that closing one doesn't shift those still to serve.
        for &(k, readable) in ready.iter().rev() {
            if k == 0 {
                match accept(lender, listener, &mut reserve) {
                    Accepted::Connection(stream) => {
                        lender.descriptors().push(stream.fd().as_raw_fd());
                        connections.push(stream);
                    }
                    Accepted::Nothing => {}
                    Accepted::BackOff => backing_off = true,
                }
                continue;
            }
            if !(readable && answer(lender, &connections[k - 1])) {
                let closed = connections.swap_remove(k - 1);
                lender
                    .descriptors()
                    .retain(|&fd| fd != closed.fd().as_raw_fd());
            }
        }
    }
}

/// How many times lenders' threads in this process woke (for tests: a lender that can't
/// accept must not spin).
static WAKEUPS: AtomicU64 = AtomicU64::new(0);

pub fn wakeups() -> u64 {
    WAKEUPS.load(Ordering::Relaxed)
}

/// A spare descriptor the lender holds, to have one to accept a connection with at this
/// process's limit of open files (and refuse it, saying why): a connection accept can't take
/// stays queued, and the listener readable. Taken before the lender's thread starts, so that
/// a process that fills its descriptors right after its first share still has it.
struct Reserve {
    fd: Option<OwnedFd>,
}

impl Reserve {
    /// A spare descriptor (listed among the lender's), if one can be had.
    fn take(lender: &Lender, listener: &Listener) -> Reserve {
        let mut reserve = Reserve { fd: None };
        reserve.refill(lender, listener);
        reserve
    }

    /// Take a spare descriptor again, if there is none and one can be had.
    fn refill(&mut self, lender: &Lender, listener: &Listener) {
        if self.fd.is_some() {
            return;
        }
        // A copy of the listener's descriptor: any would do, and this one is always open.
        let Ok(fd) = rustix::io::fcntl_dupfd_cloexec(listener.fd(), 0) else {
            return;
        };
        lender.descriptors().push(fd.as_raw_fd());
        self.fd = Some(fd);
    }

    /// Close the spare descriptor (for accept to take its number): whether there was one.
    fn spend(&mut self, lender: &Lender) -> bool {
        let Some(fd) = self.fd.take() else {
            return false;
        };
        lender.descriptors().retain(|&kept| kept != fd.as_raw_fd());
        drop(fd);
        true
    }
}

enum Accepted {
    Connection(Stream),
    /// None to serve (another user's, refused, or gone).
    Nothing,
    /// A connection is still queued that can't be taken now: leave the listener alone a while
    /// rather than spin on it.
    BackOff,
}

/// Accept the next connection. At this process's limit of open files, the connection is taken
/// with the spare descriptor and refused, saying why (the receiver hears it at once, instead of
/// waiting for an answer that can't come), the spare taken again after; without a spare, or on
/// another failure that leaves the connection queued, back off.
fn accept(lender: &Lender, listener: &Listener, reserve: &mut Reserve) -> Accepted {
    let err = match listener.accept(ANSWER_TIMEOUT) {
        Ok(Some(stream)) => return Accepted::Connection(stream),
        Ok(None) => return Accepted::Nothing,
        Err(err) => err,
    };
    let out_of_files = matches!(err.errno(), Some(Errno::MFILE | Errno::NFILE));
    if !(out_of_files && reserve.spend(lender)) {
        // ECONNABORTED and the like: the connection is gone from the queue; other failures
        // (memory) may leave it there.
        let gone = matches!(
            err.errno(),
            Some(Errno::CONNABORTED | Errno::PROTO | Errno::PERM)
        );
        return if gone {
            Accepted::Nothing
        } else {
            Accepted::BackOff
        };
    }
    if let Ok(Some(stream)) = listener.accept(ANSWER_TIMEOUT) {
        let mut refusal = vec![REFUSED];
        refusal.extend_from_slice(out_of_files_here(lender).as_bytes());
        let _ = stream.try_send(&refusal); // a new connection's buffer has room
    }
    reserve.refill(lender, listener);
    Accepted::Nothing
}

/// What a receiver is told when this process is at its limit of open files.
fn out_of_files_here(lender: &Lender) -> String {
    let (soft, _) = system::open_files_limit();
    let soft = soft.map_or("unlimited".to_owned(), |n| n.to_string());
    format!(
        "the process that shared this memory (pid {}) is at its limit of open files \
         (RLIMIT_NOFILE, soft limit {soft}), so it can't take the connection this handle is \
         lent through (this process can't open the producer's descriptors through /proc): \
         raise that process's limit (resource.setrlimit(resource.RLIMIT_NOFILE, ...), ulimit \
         -n), or let it hold fewer descriptors",
        lender.address.pid
    )
}

/// Answer one message on `stream`; false at end of file (the receiver closed or died), on a
/// message no receiver of ours sends, or when the receiver went away mid-answer.
fn answer(lender: &Lender, stream: &Stream) -> bool {
    let mut message = [0u8; 1 + TOKEN_BYTES];
    let Ok((len @ 1.., _)) = stream.receive(&mut message) else {
        return false;
    };
    let token = &message[1..len];
    match message[0] {
        CLAIM => {
            // The pin stays until the receiver releases it, once it holds its lock on the
            // segment (before then, the segment must not be reused).
            let pinned = {
                let pins = lender.pins();
                pins.by_token
                    .get(token)
                    .filter(|pin| !Pins::released(pin, &lender.board))
                    .map(|pin| (pin.segment.clone(), pin.writable))
            };
            let sent = match &pinned {
                Some((segment, writable)) => segment
                    .fd_for(*writable)
                    .and_then(|fd| stream.send(&[GRANTED], Some(fd))),
                None => {
                    let mut refusal = vec![REFUSED];
                    refusal.extend_from_slice(NOT_PINNED.as_bytes());
                    stream.send(&refusal, None)
                }
            };
            drop(pinned);
            sent.is_ok()
        }
        RELEASE => {
            let pin = lender.pins().remove(token, &lender.board);
            drop(pin);
            true
        }
        _ => false,
    }
}

/// In a forked child: the parent's lender is the parent's (its thread did not fork). The child
/// closes its copies of the lender's sockets and board (the parent's stay open) and forgets its
/// pins, and starts a lender of its own when it first lends.
pub fn renew_in_child() {
    let Some(mut slot) = LENDER.renew() else {
        return;
    };
    let Some(lender) = slot.take() else {
        return;
    };
    if let Ok(mut descriptors) = lender.descriptors.try_lock() {
        for fd in descriptors.drain(..) {
            // SAFETY: the number of one of the lender's descriptors, inherited by this child,
            // whose owners (the lender's thread, and the lender, never dropped here) never close
            // it here: closed once, by us.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    if let Ok(mut pins) = lender.pins.try_lock() {
        pins.by_token.clear();
    }
    // Never dropped: its descriptors are closed above, not by their owners.
    std::mem::forget(lender);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_tokens_name_their_parts() {
        let address = Address {
            pid: 12,
            id: 255,
            board_fd: 7,
        };
        assert_eq!(address.name(), "dlpack-share/12/00000000000000ff/7");

        let mut token = [0u8; TOKEN_BYTES];
        assert_eq!(slot_of(&token), None); // nonce 0
        token[..4].copy_from_slice(&3u32.to_le_bytes());
        token[4..12].copy_from_slice(&9u64.to_le_bytes());
        assert_eq!(slot_of(&token), Some((3, 9)));
        token[..4].copy_from_slice(&NO_SLOT.to_le_bytes());
        assert_eq!(slot_of(&token), None);
        assert_eq!(slot_of(&token[..8]), None);
    }
}
