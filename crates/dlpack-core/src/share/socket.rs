//! Unix sockets of packets (`SOCK_SEQPACKET`: each message arrives whole, in order) at abstract
//! addresses (no file; the address goes with the socket), passing descriptors (`SCM_RIGHTS`).
//! Only processes of the same user (effective uid, as peer credentials carry it) are served.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::sockopt::{self, Timeout};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{Error, Result};

/// A listening socket at an abstract address.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Listen at the abstract address `name`.
    pub fn bind(name: &[u8]) -> Result<Listener> {
        let fd = new_socket()?;
        let address = SocketAddrUnix::new_abstract_name(name).map_err(Error::os("bind"))?;
        net::bind(&fd, &address).map_err(Error::os("bind"))?;
        net::listen(&fd, 64).map_err(Error::os("listen"))?;
        Ok(Listener { fd })
    }

    /// The next connection, or `None` when its peer runs as another user (then closed). Sends
    /// on it give up after `send_timeout`.
    pub fn accept(&self, send_timeout: Duration) -> Result<Option<Stream>> {
        let fd = net::accept_with(&self.fd, SocketFlags::CLOEXEC).map_err(Error::os("accept"))?;
        if peer_uid(&fd)? != super::system::uid() {
            return Ok(None);
        }
        sockopt::set_socket_timeout(&fd, Timeout::Send, Some(send_timeout))
            .map_err(Error::os("setsockopt(SO_SNDTIMEO)"))?;
        Ok(Some(Stream { fd }))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One end of a connection.
#[derive(Debug)]
pub struct Stream {
    fd: OwnedFd,
}

impl Stream {
    /// Connect to the abstract address `name`; sends and receives on the connection give up
    /// after `timeout` (a receive then fails with `EAGAIN`).
    pub fn connect(name: &[u8], timeout: Duration) -> Result<Stream> {
        let fd = new_socket()?;
        let address = SocketAddrUnix::new_abstract_name(name).map_err(Error::os("connect"))?;
        for id in [Timeout::Recv, Timeout::Send] {
            sockopt::set_socket_timeout(&fd, id, Some(timeout)).map_err(Error::os("setsockopt"))?;
        }
        loop {
            match net::connect(&fd, &address) {
                Ok(()) => return Ok(Stream { fd }),
                Err(Errno::INTR) => continue,
                Err(errno) => return Err(Error::os("connect")(errno)),
            }
        }
    }

    /// The effective uid of the peer when it connected (or, for a connection made by `connect`,
    /// when it listened), as the kernel recorded it.
    pub fn peer_uid(&self) -> Result<u32> {
        peer_uid(&self.fd)
    }

    /// Send one message, with a descriptor attached if given.
    pub fn send(&self, message: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<()> {
        self.send_with(message, fd, SendFlags::NOSIGNAL).map(drop)
    }

    /// Send one message if the socket's buffer has room now, never waiting for the peer (which
    /// may be stopped): false when it has none.
    pub fn try_send(&self, message: &[u8]) -> Result<bool> {
        self.send_with(message, None, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)
    }

    fn send_with(
        &self,
        message: &[u8],
        fd: Option<BorrowedFd<'_>>,
        flags: SendFlags,
    ) -> Result<bool> {
        let fds = fd.as_slice();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        let parts = [IoSlice::new(message)];
        loop {
            return match net::sendmsg(&self.fd, &parts, &mut control, flags) {
                Ok(_) => Ok(true),
                Err(Errno::WOULDBLOCK) if flags.contains(SendFlags::DONTWAIT) => Ok(false),
                Err(Errno::INTR) => continue,
                Err(errno) => Err(Error::os("sendmsg")(errno)),
            };
        }
    }

    /// Receive one message into `buffer` (a longer one is cut): its length (0 at end of file),
    /// and the descriptor attached, if any (any more are closed). A descriptor sent that the
    /// kernel could not install here is an error: `EMFILE` at this process's limit of open
    /// files.
    pub fn receive(&self, buffer: &mut [u8]) -> Result<(usize, Option<OwnedFd>)> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut parts = [IoSliceMut::new(buffer)];
        let received = loop {
            match net::recvmsg(&self.fd, &mut parts, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(received) => break received,
                Err(Errno::INTR) => continue,
                Err(errno) => return Err(Error::os("recvmsg")(errno)),
            }
        };
        let mut fd = None;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                for received_fd in fds {
                    fd.get_or_insert(received_fd);
                }
            }
        }
        if fd.is_none() && received.flags.contains(ReturnFlags::CTRUNC) {
            return Err(dropped_descriptor(self.fd.as_fd()));
        }
        Ok((received.bytes, fd))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn peer_uid(fd: &OwnedFd) -> Result<u32> {
    let peer = sockopt::socket_peercred(fd).map_err(Error::os("getsockopt(SO_PEERCRED)"))?;
    Ok(peer.uid.as_raw())
}

/// The error of a descriptor sent but not received (`MSG_CTRUNC` with room for it): the kernel
/// drops one it can't install without saying why, so a new descriptor is asked for, which fails
/// the same way at this process's limit of open files.
fn dropped_descriptor(any: BorrowedFd<'_>) -> Error {
    // `dup`, not `F_DUPFD_CLOEXEC`, whose lowest number (0) is EINVAL under a limit of 0; the
    // copy lives only until the end of this call.
    match rustix::io::dup(any) {
        Err(errno) => Error::os("recvmsg")(errno),
        Ok(_room) => Error::buffer(
            "the descriptor sent with the answer was dropped (MSG_CTRUNC), though this process \
             can open one: a security module may refuse descriptors passed",
        ),
    }
}

fn new_socket() -> Result<OwnedFd> {
    net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(Error::os("socket"))
}

#[cfg(test)]
mod tests {
    use super::super::memfd::SealedFile;
    use super::*;

    fn name() -> Vec<u8> {
        let random = super::super::system::random::<8>().unwrap();
        format!("dlpack-share-test/{random:02x?}").into_bytes()
    }

    #[test]
    fn messages_and_descriptors_cross() {
        let name = name();
        let listener = Listener::bind(&name).unwrap();
        let client = Stream::connect(&name, Duration::from_secs(5)).unwrap();
        let server = listener.accept(Duration::from_secs(5)).unwrap().unwrap();
        let uid = super::super::system::uid();
        assert_eq!(
            (client.peer_uid().unwrap(), server.peer_uid().unwrap()),
            (uid, uid)
        );

        client.send(b"hello", None).unwrap();
        let mut buffer = [0u8; 3];
        assert_eq!(server.receive(&mut buffer).unwrap().0, 3); // cut to the buffer
        assert_eq!(&buffer, b"hel");

        let file = SealedFile::create(c"test", 4096).unwrap();
        server.send(b"K", Some(file.fd())).unwrap();
        let mut buffer = [0u8; 16];
        let (n, fd) = client.receive(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"K");
        let passed = SealedFile::check(fd.unwrap(), Some(file.id()), 4096, true).unwrap();
        assert_eq!(passed.id(), file.id());

        drop(server);
        let (n, fd) = client.receive(&mut buffer).unwrap();
        assert!(n == 0 && fd.is_none());
    }

    #[test]
    fn receives_time_out_and_missing_peers_refuse() {
        let name = name();
        let listener = Listener::bind(&name).unwrap();
        let client = Stream::connect(&name, Duration::from_millis(20)).unwrap();
        let err = client.receive(&mut [0u8; 4]).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::AGAIN));
        drop(listener);
        let err = Stream::connect(&name, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::CONNREFUSED));
        // One address, one listener.
        let _again = Listener::bind(&name).unwrap();
        assert!(Listener::bind(&name).is_err());
    }

    /// Set in the child process `a_descriptor_beyond_the_limit_of_open_files_is_an_error` runs
    /// its body in (a limit of open files holds for the whole process).
    const CHILD: &str = "DLPACK_CORE_TEST_LIMITED_CHILD";

    #[test]
    fn a_descriptor_beyond_the_limit_of_open_files_is_an_error() {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

        if std::env::var_os(CHILD).is_none() {
            let test =
                "share::socket::tests::a_descriptor_beyond_the_limit_of_open_files_is_an_error";
            let child = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", test, "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&child.stdout);
            assert!(
                child.status.success() && stdout.contains("1 passed"),
                "{stdout}{}",
                String::from_utf8_lossy(&child.stderr)
            );
            return;
        }
        let name = name();
        let listener = Listener::bind(&name).unwrap();
        let client = Stream::connect(&name, Duration::from_secs(5)).unwrap();
        let server = listener.accept(Duration::from_secs(5)).unwrap().unwrap();
        let file = SealedFile::create(c"test", 4096).unwrap();
        let limit = getrlimit(Resource::Nofile);
        let none = Rlimit {
            current: Some(0),
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, none).unwrap();
        server.send(b"K", Some(file.fd())).unwrap();
        let received = client.receive(&mut [0u8; 4]);
        setrlimit(Resource::Nofile, limit).unwrap();
        assert_eq!(received.unwrap_err(), Error::os("recvmsg")(Errno::MFILE));
        // With room again, the next arrives.
        server.send(b"K", Some(file.fd())).unwrap();
        assert!(client.receive(&mut [0u8; 4]).unwrap().1.is_some());
    }
}
