//! Lending the segments that handles name to the processes that receive them.
//!
//! Pickling a handle pins its segment in this process's lender under a fresh random token, so
//! the memory outlives the handle until a receiver has it (a pickle never opened keeps its
//! segment until this process exits, as `multiprocessing`'s own descriptor passing does). The
//! lender is a thread serving a Unix socket at an abstract address named after the process and a
//! random suffix (so it vanishes with the process, and a later process with the same pid can't
//! answer for it); only processes of the same user are served, and it never needs Python. A
//! receiver keeps one connection to each producer (`client`) and, on it:
//!
//! - releases a token without waiting for an answer, once it has the segment: mapped already,
//!   or opened straight from this process's descriptor table through /proc (the handle names
//!   the descriptor lent), so that only the handle's few bytes crossed;
//! - or, where /proc won't serve, claims the token first and gets the segment's descriptor
//!   (`SCM_RIGHTS`), then releases it.
//!
//! The pin lasts until the release, which comes after the receiver holds its lock on the
//! segment: until then, the segment must be neither freed nor reused.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};

use super::os::{Error, Listener, Result, Stream, system};
use super::per_process::PerProcess;
use super::segment::Segment;

/// Bytes of a token.
pub const TOKEN_BYTES: usize = 16;
pub type Token = [u8; TOKEN_BYTES];

/// A receiver's requests, each followed by a token, and the lender's answers.
pub const CLAIM: u8 = b'C';
pub const RELEASE: u8 = b'R';
pub const GRANTED: u8 = b'K';
pub const REFUSED: u8 = b'E';

/// How long either side waits for the other: a process holding the GIL in a long computation
/// delays its answers, but one that never answers must not hang the other.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// What a claim of a token that is not pinned is told.
const NOT_PINNED: &str = "this handle was already opened from its pickle and its memory is no \
                          longer shared, or it was not made by this process";

pub struct Lender {
    /// Where receivers reach it, as handles carry it: a NUL, then the abstract name.
    address: String,
    pins: Mutex<HashMap<Token, Pin>>,
    /// The descriptor numbers of its sockets, for a forked child to close its copies.
    sockets: Mutex<Vec<RawFd>>,
}

/// What a token lends: the segment (alive until released), and which of its descriptors.
struct Pin {
    segment: Arc<Segment>,
    writable: bool,
}

static LENDER: PerProcess<Option<Arc<Lender>>> = PerProcess::new(|| None);

/// Pin `segment` for a handle (writable or not) under a new token: the lender's address, the
/// token, and the number of the descriptor lent (receivers open it through /proc when they can).
pub fn lend(segment: Arc<Segment>, writable: bool) -> Result<(Arc<Lender>, Token, RawFd)> {
    let lender = started()?;
    let fd = segment.fd_for(writable)?.as_raw_fd();
    let token = system::random::<TOKEN_BYTES>()?;
    let pin = Pin { segment, writable };
    lender.pins().insert(token, pin);
    Ok((lender, token, fd))
}

/// This process's lender, if it started.
pub fn own() -> Option<Arc<Lender>> {
    LENDER.lock().clone()
}

/// How many tokens are pinned here.
pub fn pinned() -> usize {
    own().map_or(0, |lender| lender.pins().len())
}

impl Lender {
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Unpin `token`: its segment, if it was pinned.
    pub fn take(&self, token: &[u8]) -> Option<Arc<Segment>> {
        let pin = self.pins().remove(token)?;
        Some(pin.segment)
    }

    fn pins(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Pin>> {
        self.pins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sockets(&self) -> std::sync::MutexGuard<'_, Vec<RawFd>> {
        self.sockets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn started() -> Result<Arc<Lender>> {
    let mut slot = LENDER.lock();
    if let Some(lender) = &*slot {
        return Ok(lender.clone());
    }
    let suffix: String = system::random::<8>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = format!("dlpack-share/{}/{suffix}", system::pid());
    let listener = Listener::bind(name.as_bytes())?;
    let lender = Arc::new(Lender {
        address: format!("\0{name}"),
        pins: Mutex::new(HashMap::new()),
        sockets: Mutex::new(vec![listener.fd().as_raw_fd()]),
    });
    let serving = lender.clone();
    std::thread::Builder::new()
        .name("dlpack-share-lender".into())
        .spawn(move || serve(&serving, &listener))
        .map_err(|err| Error::buffer(format!("can't start the lender thread: {err}")))?;
    *slot = Some(lender.clone());
    Ok(lender)
}

/// The lender's thread: accept connections, answer claims, take releases, forever (it ends
/// with the process).
fn serve(lender: &Lender, listener: &Listener) {
    let mut connections: Vec<Stream> = Vec::new();
    loop {
        let ready: Vec<(usize, bool)> = {
            let mut fds: Vec<PollFd<'_>> = std::iter::once(listener.fd())
                .chain(connections.iter().map(Stream::fd))
                .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
                .collect();
            if poll(&mut fds, None).is_err() {
                continue; // interrupted
            }
            fds.iter()
                .enumerate()
                .filter(|(_, fd)| !fd.revents().is_empty())
                .map(|(k, fd)| (k, fd.revents().intersects(PollFlags::IN)))
                .collect()
        };
        // Later connections first, so that closing one doesn't shift those still to serve.
        for &(k, readable) in ready.iter().rev() {
            if k == 0 {
                if let Ok(Some(stream)) = listener.accept(ANSWER_TIMEOUT) {
                    lender.sockets().push(stream.fd().as_raw_fd());
                    connections.push(stream);
                }
                continue;
            }
            if !(readable && answer(lender, &connections[k - 1])) {
                let closed = connections.swap_remove(k - 1);
                lender.sockets().retain(|&fd| fd != closed.fd().as_raw_fd());
            }
        }
    }
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
            let pinned = lender
                .pins()
                .get(token)
                .map(|pin| (pin.segment.clone(), pin.writable));
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
            sent.is_ok()
        }
        RELEASE => {
            drop(lender.take(token));
            true
        }
        _ => false,
    }
}

/// In a forked child: the parent's lender is the parent's (its thread did not fork). The child
/// closes its copies of the lender's sockets (the parent's stay open) and forgets its pins, and
/// starts a lender of its own when it first lends.
pub fn renew_in_child() {
    let Some(mut slot) = LENDER.renew() else {
        return;
    };
    let Some(lender) = slot.take() else {
        return;
    };
    if let Ok(mut sockets) = lender.sockets.try_lock() {
        for fd in sockets.drain(..) {
            // SAFETY: the number of one of the lender's sockets, inherited by this child, whose
            // only owner (the lender's thread) does not exist here: closed once, by us.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    if let Ok(mut pins) = lender.pins.try_lock() {
        pins.clear();
    }
    // Never dropped: its thread's copies of the sockets are closed above, not by their owners.
    std::mem::forget(lender);
}
