//! Just enough rtnetlink (`NETLINK_ROUTE`) for the Linux namespace driver:
//! list interfaces, create a veth pair, delete an interface, move one to
//! another network namespace (`IFLA_NET_NS_FD`), set it up or down, and add
//! an address — what `ip link` and `ip addr` send.
//!
//! A socket answers for the network namespace it was created in: the
//! driver opens one per namespace inside it (`in_netns_file`).
//!
//! Messages are built and parsed here without I/O (the framing is
//! `softverbs::sys::netlink`'s: [`Msg`], [`parse`] over its checked
//! splitting) and tested on bytes; [`Rtnl`] asks the kernel through that
//! module's socket.

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use softverbs::sys::netlink::{
    self as nl, Msg, NLMSG_DONE, NLMSG_ERROR, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE,
};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_F_NODAD: u8 = 0x02;

/// `IFF_UP`: administratively up.
pub(crate) const IFF_UP: u32 = 0x1;
/// `IFF_LOWER_UP`: the driver signals carrier (for a veth: both ends up).
pub(crate) const IFF_LOWER_UP: u32 = 0x1_0000;

/// `struct ifinfomsg`.
const IFINFOMSG: usize = 16;
/// `struct ifaddrmsg`.
const IFADDRMSG: usize = 8;
/// Longest interface name (`IFNAMSIZ` less the NUL).
pub(crate) const IFNAME_MAX: usize = 15;

/// `struct ifinfomsg` for interface `index` (0: none), setting `flags`
/// under `change`.
fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; IFINFOMSG] {
    let mut b = [0u8; IFINFOMSG];
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `RTM_GETLINK` dump: every interface.
pub(crate) fn get_links() -> Msg {
    let mut m = Msg::request(RTM_GETLINK, NLM_F_DUMP);
    m.raw(&ifinfomsg(0, 0, 0));
    m
}

/// `RTM_NEWLINK` creating veth `a` with peer `b` (`ip link add A type veth
/// peer name B`).
pub(crate) fn new_veth(a: &str, b: &str) -> Msg {
    let mut m = Msg::request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
    m.raw(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, a);
    let info = m.nest_begin(IFLA_LINKINFO);
    m.attr_str(IFLA_INFO_KIND, "veth");
    let data = m.nest_begin(IFLA_INFO_DATA);
    let peer = m.nest_begin(VETH_INFO_PEER);
    m.raw(&ifinfomsg(0, 0, 0)).attr_str(IFLA_IFNAME, b);
    m.nest_end(peer);
    m.nest_end(data);
    m.nest_end(info);
    m
}

/// `RTM_DELLINK` of interface `index` (`ip link del`).
pub(crate) fn del_link(index: i32) -> Msg {
    let mut m = Msg::request(RTM_DELLINK, NLM_F_ACK);
    m.raw(&ifinfomsg(index, 0, 0));
    m
}

/// `RTM_NEWLINK` moving interface `index` to the namespace open at `ns_fd`
/// (`ip link set IF netns NS`).
pub(crate) fn set_netns(index: i32, ns_fd: RawFd) -> Msg {
    let mut m = Msg::request(RTM_NEWLINK, NLM_F_ACK);
    m.raw(&ifinfomsg(index, 0, 0))
        .attr(IFLA_NET_NS_FD, &ns_fd.to_ne_bytes());
    m
}

/// `RTM_NEWLINK` setting interface `index` up or down (`ip link set IF up`).
pub(crate) fn set_up(index: i32, up: bool) -> Msg {
    let mut m = Msg::request(RTM_NEWLINK, NLM_F_ACK);
    m.raw(&ifinfomsg(index, if up { IFF_UP } else { 0 }, IFF_UP));
    m
}

/// `RTM_NEWADDR` giving interface `index` the address `addr/prefix`
/// (`ip addr replace`; IPv6 without duplicate address detection, so the
/// address is usable at once).
pub(crate) fn add_addr(index: i32, addr: IpAddr, prefix: u8) -> Msg {
    addr_msg(
        Msg::request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE | NLM_F_ACK),
        index,
        addr,
        prefix,
    )
}

/// `RTM_DELADDR` taking `addr/prefix` from interface `index` (`ip addr del`).
pub(crate) fn del_addr(index: i32, addr: IpAddr, prefix: u8) -> Msg {
    addr_msg(Msg::request(RTM_DELADDR, NLM_F_ACK), index, addr, prefix)
}

/// `m` with the `ifaddrmsg` and attributes naming `addr/prefix` on
/// interface `index`.
fn addr_msg(mut m: Msg, index: i32, addr: IpAddr, prefix: u8) -> Msg {
    let (family, bytes): (u8, Vec<u8>) = match addr {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let flags = if addr.is_ipv6() { IFA_F_NODAD } else { 0 };
    let mut hdr = [0u8; IFADDRMSG];
    hdr[0] = family;
    hdr[1] = prefix;
    hdr[2] = flags;
    hdr[4..8].copy_from_slice(&(index as u32).to_ne_bytes());
    m.raw(&hdr).attr(IFA_LOCAL, &bytes).attr(IFA_ADDRESS, &bytes);
    m
}

/// `RTM_GETADDR` dump: every address of every interface.
pub(crate) fn get_addrs() -> Msg {
    let mut m = Msg::request(RTM_GETADDR, NLM_F_DUMP);
    m.raw(&[0u8; IFADDRMSG]);
    m
}

/// One interface as `RTM_NEWLINK` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// `ifindex`.
    pub(crate) index: i32,
    /// Name.
    pub(crate) name: String,
    /// `IFF_*` flags.
    pub(crate) flags: u32,
}

impl LinkInfo {
    /// Up and with carrier: what a RoCE port's state follows (rxe reports
    /// its port active exactly when its netdev is running with carrier).
    pub(crate) fn oper_up(&self) -> bool {
        self.flags & IFF_UP != 0 && self.flags & IFF_LOWER_UP != 0
    }
}

/// One message of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// An interface (`RTM_NEWLINK`).
    Link(LinkInfo),
    /// An address of interface `.0` (`RTM_NEWADDR`).
    Addr(i32, IpAddr),
    /// The end of a dump.
    Done,
    /// An acknowledgement (0) or an error (a positive errno).
    Ack(i32),
    /// Anything else.
    Other,
}

/// Splits a datagram into `(sequence number, reply)`s.
pub(crate) fn parse(buf: &[u8]) -> io::Result<Vec<(u32, Reply)>> {
    let mut out = Vec::new();
    for m in nl::messages(buf)? {
        let body = m.payload;
        let reply = match m.ty {
            NLMSG_DONE => Reply::Done,
            NLMSG_ERROR => Reply::Ack(-nl::error_code(body)?),
            RTM_NEWLINK => {
                if body.len() < IFINFOMSG {
                    return Err(nl::bad("short ifinfomsg").into());
                }
                let index = i32::from_ne_bytes(body[4..8].try_into().expect("4 bytes"));
                let flags = u32::from_ne_bytes(body[8..12].try_into().expect("4 bytes"));
                let name = nl::attrs(&body[IFINFOMSG..])?
                    .into_iter()
                    .find(|(t, _)| *t == IFLA_IFNAME)
                    .map(|(_, v)| nl::attr_str(v))
                    .unwrap_or_default();
                Reply::Link(LinkInfo { index, name, flags })
            }
            RTM_NEWADDR => {
                if body.len() < IFADDRMSG {
                    return Err(nl::bad("short ifaddrmsg").into());
                }
                let index = u32::from_ne_bytes(body[4..8].try_into().expect("4 bytes")) as i32;
                let attrs = nl::attrs(&body[IFADDRMSG..])?;
                // IFA_LOCAL is the interface's own address where it
                // differs from IFA_ADDRESS (point-to-point).
                let raw = attrs
                    .iter()
                    .find(|(t, _)| *t == IFA_LOCAL)
                    .or_else(|| attrs.iter().find(|(t, _)| *t == IFA_ADDRESS))
                    .map(|(_, v)| *v);
                match raw.and_then(|v| match v.len() {
                    4 => Some(IpAddr::from(<[u8; 4]>::try_from(v).expect("4 bytes"))),
                    16 => Some(IpAddr::from(<[u8; 16]>::try_from(v).expect("16 bytes"))),
                    _ => None,
                }) {
                    Some(a) => Reply::Addr(index, a),
                    None => Reply::Other,
                }
            }
            _ => Reply::Other,
        };
        out.push((m.seq, reply));
    }
    Ok(out)
}

/// An rtnetlink socket, answering for the namespace it was opened in.
/// Shared by the driver's threads: one request and its replies at a time.
#[derive(Debug)]
pub(crate) struct Rtnl {
    sock: nl::Socket,
    seq: AtomicU32,
    /// Held from a request's send to its last reply: two threads reading
    /// one socket would each take (and drop, as another sequence number)
    /// the other's replies.
    exchange: Mutex<()>,
}

/// How long a request waits for the kernel's answer (never reached unless
/// the kernel drops the reply: it answers synchronously).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    ///
    /// The `socket(2)`/`bind(2)` error.
    pub(crate) fn open() -> io::Result<Rtnl> {
        Ok(Rtnl {
            sock: nl::Socket::open(libc::NETLINK_ROUTE, REPLY_TIMEOUT)?,
            seq: AtomicU32::new(1),
            exchange: Mutex::new(()),
        })
    }

    /// Sends `msg` and collects the replies of its sequence number until
    /// the end of the dump or the acknowledgement.
    fn request(&self, msg: Msg) -> io::Result<Vec<Reply>> {
        let _one = self.exchange.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.sock.send(&msg.finish(seq))?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut out = Vec::new();
        loop {
            let n = self.sock.recv(&mut buf)?;
            for (s, reply) in parse(&buf[..n])? {
                if s != seq {
                    continue; // a late reply to an earlier, failed request
                }
                match reply {
                    Reply::Done => return Ok(out),
                    Reply::Ack(0) => return Ok(out),
                    Reply::Ack(e) => return Err(io::Error::from_raw_os_error(e)),
                    r => out.push(r),
                }
            }
        }
    }

    /// Every interface of the namespace.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub(crate) fn links(&self) -> io::Result<Vec<LinkInfo>> {
        Ok(self
            .request(get_links())?
            .into_iter()
            .filter_map(|r| match r {
                Reply::Link(l) => Some(l),
                _ => None,
            })
            .collect())
    }

    /// Every address of the namespace: `(interface index, address)`.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub(crate) fn addrs(&self) -> io::Result<Vec<(i32, IpAddr)>> {
        Ok(self
            .request(get_addrs())?
            .into_iter()
            .filter_map(|r| match r {
                Reply::Addr(i, a) => Some((i, a)),
                _ => None,
            })
            .collect())
    }

    /// The interface named `name`, if the namespace has it.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub(crate) fn link(&self, name: &str) -> io::Result<Option<LinkInfo>> {
        Ok(self.links()?.into_iter().find(|l| l.name == name))
    }

    /// Sends a request that only wants an acknowledgement.
    ///
    /// # Errors
    ///
    /// The kernel's errno.
    pub(crate) fn ack(&self, msg: Msg) -> io::Result<()> {
        self.request(msg).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs::sys::netlink::{attrs, HDR, NLA_F_NESTED, NLM_F_REQUEST};

    fn u16_at(b: &[u8], i: usize) -> u16 {
        u16::from_ne_bytes([b[i], b[i + 1]])
    }

    #[test]
    fn address_requests_are_requests() {
        // The kernel ignores a message without NLM_F_REQUEST: a dump
        // without it never gets an answer.
        let b = get_addrs().finish(3);
        assert_eq!(u16_at(&b, 4), RTM_GETADDR);
        assert_eq!(u16_at(&b, 6), NLM_F_REQUEST | NLM_F_DUMP);
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let b = del_addr(5, ip, 24).finish(4);
        assert_eq!(u16_at(&b, 4), RTM_DELADDR);
        assert_eq!(u16_at(&b, 6), NLM_F_REQUEST | NLM_F_ACK);
        let add = add_addr(5, ip, 24).finish(4);
        assert_eq!(
            u16_at(&add, 6),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        );
        // The same ifaddrmsg and attributes as the addition.
        assert_eq!(b[HDR..], add[HDR..]);
    }

    #[test]
    fn veth_request_layout() {
        let b = new_veth("sva", "svb").finish(7);
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(u16_at(&b, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&b, 6), NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(b[8..12].try_into().unwrap()), 7);
        let top = attrs(&b[HDR + IFINFOMSG..]).unwrap();
        assert_eq!(top[0], (IFLA_IFNAME, &b"sva\0"[..]));
        assert_eq!(top[1].0, IFLA_LINKINFO);
        let info = attrs(top[1].1).unwrap();
        assert_eq!(info[0], (IFLA_INFO_KIND, &b"veth\0"[..]));
        let data = attrs(info[1].1).unwrap();
        assert_eq!(data[0].0, VETH_INFO_PEER);
        let peer = attrs(&data[0].1[IFINFOMSG..]).unwrap();
        assert_eq!(peer[0], (IFLA_IFNAME, &b"svb\0"[..]));
        // Nested attributes carry the flag on the wire.
        assert_eq!(u16_at(&b, HDR + IFINFOMSG + 8 + 2) & NLA_F_NESTED, NLA_F_NESTED);
    }

    #[test]
    fn small_requests_layout() {
        let b = set_netns(5, 9).finish(1);
        assert_eq!(i32::from_ne_bytes(b[HDR + 4..HDR + 8].try_into().unwrap()), 5);
        assert_eq!(
            attrs(&b[HDR + IFINFOMSG..]).unwrap(),
            [(IFLA_NET_NS_FD, &9i32.to_ne_bytes()[..])]
        );
        let b = set_up(3, true).finish(1);
        assert_eq!(u32::from_ne_bytes(b[HDR + 8..HDR + 12].try_into().unwrap()), IFF_UP);
        assert_eq!(u32::from_ne_bytes(b[HDR + 12..HDR + 16].try_into().unwrap()), IFF_UP);
        let b = add_addr(4, "10.1.2.3".parse().unwrap(), 24).finish(1);
        assert_eq!(b[HDR], libc::AF_INET as u8);
        assert_eq!(b[HDR + 1], 24);
        let a = attrs(&b[HDR + IFADDRMSG..]).unwrap();
        assert_eq!(a[0], (IFA_LOCAL, &[10u8, 1, 2, 3][..]));
        let b = add_addr(4, "fd00::1".parse().unwrap(), 64).finish(1);
        assert_eq!(b[HDR + 2], IFA_F_NODAD);
    }

    #[test]
    fn replies_parse() {
        // A link message, then an error for seq 3, then DONE.
        let mut link = Msg::new(RTM_NEWLINK, 0);
        link.raw(&ifinfomsg(12, IFF_UP | IFF_LOWER_UP, 0))
            .attr_str(IFLA_IFNAME, "veth9");
        let mut data = link.finish(3);
        let mut err = Msg::new(NLMSG_ERROR, 0);
        err.raw(&(-libc::EEXIST).to_ne_bytes());
        data.extend(err.finish(3));
        data.extend(Msg::new(NLMSG_DONE, 0).finish(4));
        let r = parse(&data).unwrap();
        assert_eq!(
            r[0],
            (
                3,
                Reply::Link(LinkInfo {
                    index: 12,
                    name: "veth9".into(),
                    flags: IFF_UP | IFF_LOWER_UP
                })
            )
        );
        assert_eq!(r[1], (3, Reply::Ack(libc::EEXIST)));
        assert_eq!(r[2], (4, Reply::Done));
        let Reply::Link(l) = &r[0].1 else { unreachable!() };
        assert!(l.oper_up());
        assert!(parse(&data[..20]).is_err());
    }
}
