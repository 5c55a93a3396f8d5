//! RDMA netlink (`NETLINK_RDMA`, the kernel's "nldev" client): what
//! `rdma system show` and `rdma dev show` read.
//!
//! - [`netns_mode`]: `RDMA_NLDEV_CMD_SYS_GET` → `RDMA_NLDEV_SYS_ATTR_NETNS_MODE`
//!   (1: shared, 0: exclusive).
//! - [`devices`]: the `RDMA_NLDEV_CMD_GET` dump — the devices of the
//!   socket's network namespace (in exclusive mode, exactly those that
//!   belong to it): index, name, node GUID, port count, protocol.
//! - [`uverbs_chardev`]: `RDMA_NLDEV_CMD_GET_CHARDEV` for `uverbs` — whether
//!   the device can be opened from user space (its uverbs node is removed
//!   first when a device goes away).
//!
//! A socket answers for the namespace it was created in: to read another
//! namespace, call these inside [`in_netns`](super::netns::in_netns).
//!
//! RDMA netlink messages carry their attributes right after the
//! `nlmsghdr` (no family header). The framing is
//! [`sys::netlink`](crate::sys::netlink)'s; parsing is separate from I/O
//! and works on fixed sample data in the tests.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::subsystem::NetnsMode;
use crate::sys::netlink::{
    self, attr_str, attr_u32, attr_u64, attrs, bad, build, error_code, messages, ParseError, NLMSG_DONE, NLMSG_ERROR,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};

/// `NETLINK_RDMA` (`<linux/netlink.h>`).
pub(crate) const NETLINK_RDMA: libc::c_int = 20;
/// `RDMA_NL_NLDEV`: the device interface client.
const RDMA_NL_NLDEV: u16 = 5;
/// `RDMA_NLDEV_CMD_GET` (can dump).
pub(crate) const CMD_GET: u16 = 1;
/// `RDMA_NLDEV_CMD_SYS_GET`.
pub(crate) const CMD_SYS_GET: u16 = 6;
/// `RDMA_NLDEV_CMD_GET_CHARDEV`.
pub(crate) const CMD_GET_CHARDEV: u16 = 15;

/// `RDMA_NLDEV_ATTR_DEV_INDEX` (u32).
pub(crate) const ATTR_DEV_INDEX: u16 = 1;
/// `RDMA_NLDEV_ATTR_DEV_NAME` (string).
pub(crate) const ATTR_DEV_NAME: u16 = 2;
/// `RDMA_NLDEV_ATTR_PORT_INDEX` (u32; in a device message, the port count).
pub(crate) const ATTR_PORT_INDEX: u16 = 3;
/// `RDMA_NLDEV_ATTR_NODE_GUID` (u64, host order of the big-endian GUID).
pub(crate) const ATTR_NODE_GUID: u16 = 6;
/// `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (u8: 1 shared, 0 exclusive).
pub(crate) const ATTR_NETNS_MODE: u16 = 66;
/// `RDMA_NLDEV_ATTR_DEV_PROTOCOL` (string: "roce", "ib", "iw", …).
pub(crate) const ATTR_DEV_PROTOCOL: u16 = 67;
/// `RDMA_NLDEV_ATTR_CHARDEV_TYPE` (string).
pub(crate) const ATTR_CHARDEV_TYPE: u16 = 69;
/// `RDMA_NLDEV_ATTR_CHARDEV_NAME` (string).
pub(crate) const ATTR_CHARDEV_NAME: u16 = 70;
/// `RDMA_NLDEV_ATTR_CHARDEV` (u64 `dev_t`).
pub(crate) const ATTR_CHARDEV: u16 = 72;

/// The netlink message type of an nldev command.
pub(crate) const fn nl_type(cmd: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + cmd
}

/// An RDMA device as the nldev dump reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlDevice {
    /// Kernel device index (a re-registered device gets a new one).
    pub index: u32,
    /// Name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Node GUID (host-order value of the big-endian GUID).
    pub node_guid: Option<u64>,
    /// Number of ports.
    pub ports: Option<u32>,
    /// Protocol (`roce`, `ib`, `iw`, `opa`), on kernels that report it.
    pub protocol: Option<String>,
}

/// Parses one device message of the `RDMA_NLDEV_CMD_GET` dump.
pub(crate) fn parse_device(payload: &[u8]) -> Result<NlDevice, ParseError> {
    let mut index = None;
    let mut name = None;
    let mut d = NlDevice {
        index: 0,
        name: String::new(),
        node_guid: None,
        ports: None,
        protocol: None,
    };
    for (ty, v) in attrs(payload)? {
        match ty {
            ATTR_DEV_INDEX => index = Some(attr_u32(v, ty)?),
            ATTR_DEV_NAME => name = Some(attr_str(v)),
            ATTR_PORT_INDEX => d.ports = Some(attr_u32(v, ty)?),
            ATTR_NODE_GUID => d.node_guid = Some(attr_u64(v, ty)?),
            ATTR_DEV_PROTOCOL => d.protocol = Some(attr_str(v)),
            _ => {}
        }
    }
    d.index = index.ok_or_else(|| bad("device message without RDMA_NLDEV_ATTR_DEV_INDEX"))?;
    d.name = name.ok_or_else(|| bad("device message without RDMA_NLDEV_ATTR_DEV_NAME"))?;
    Ok(d)
}

/// Parses the `RDMA_NLDEV_CMD_SYS_GET` reply: the netns mode, if reported.
pub(crate) fn parse_netns_mode(payload: &[u8]) -> Result<Option<NetnsMode>, ParseError> {
    for (ty, v) in attrs(payload)? {
        if ty == ATTR_NETNS_MODE {
            let b = *v.first().ok_or_else(|| bad("empty RDMA_NLDEV_SYS_ATTR_NETNS_MODE"))?;
            return Ok(Some(if b != 0 {
                NetnsMode::Shared
            } else {
                NetnsMode::Exclusive
            }));
        }
    }
    Ok(None)
}

/// A character device of an RDMA device (`uverbs0`, its `dev_t`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlChardev {
    /// Name (`uverbs0`).
    pub name: String,
    /// `dev_t` (major/minor), if reported.
    pub dev: Option<u64>,
}

/// Parses the `RDMA_NLDEV_CMD_GET_CHARDEV` reply.
pub(crate) fn parse_chardev(payload: &[u8]) -> Result<Option<NlChardev>, ParseError> {
    let mut name = None;
    let mut dev = None;
    for (ty, v) in attrs(payload)? {
        match ty {
            ATTR_CHARDEV_NAME => name = Some(attr_str(v)),
            ATTR_CHARDEV => dev = Some(attr_u64(v, ty)?),
            _ => {}
        }
    }
    Ok(name.map(|name| NlChardev { name, dev }))
}

/// The payloads of the replies to request `seq`, ending at `NLMSG_DONE`
/// (dumps) or the acknowledgement; a negative `NLMSG_ERROR` becomes that
/// errno. `Ok(None)`: more datagrams are to come.
pub(crate) fn collect_replies(datagram: &[u8], seq: u32, out: &mut Vec<Vec<u8>>) -> io::Result<Option<()>> {
    for m in messages(datagram)? {
        if m.seq != seq {
            continue;
        }
        match m.ty {
            NLMSG_DONE => return Ok(Some(())),
            NLMSG_ERROR => {
                let code = error_code(m.payload)?;
                return if code == 0 {
                    Ok(Some(()))
                } else {
                    Err(io::Error::from_raw_os_error(-code))
                };
            }
            _ => out.push(m.payload.to_vec()),
        }
    }
    Ok(None)
}

/// A `NETLINK_RDMA` socket (of the calling thread's network namespace).
pub(crate) struct Socket {
    sock: netlink::Socket,
}

impl Socket {
    /// Opens one. Fails with `EPROTONOSUPPORT` where the kernel has no RDMA
    /// subsystem loaded.
    pub(crate) fn open() -> io::Result<Socket> {
        Ok(Socket {
            sock: netlink::Socket::open(NETLINK_RDMA, Duration::from_secs(2))?,
        })
    }

    /// Sends one request and returns the payloads of its replies.
    pub(crate) fn request(&self, cmd: u16, dump: bool, attrs: &[(u16, &[u8])]) -> io::Result<Vec<Vec<u8>>> {
        static SEQ: AtomicU32 = AtomicU32::new(1);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
        self.sock.send(&build(nl_type(cmd), flags, seq, attrs))?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.sock.recv(&mut buf)?;
            if collect_replies(&buf[..n], seq, &mut out)?.is_some() {
                return Ok(out);
            }
        }
    }
}

/// The RDMA subsystem's network namespace mode (`rdma system show`).
///
/// # Errors
///
/// No RDMA netlink (`EPROTONOSUPPORT`), a kernel without the attribute
/// (`ENODATA`), or the socket's error.
pub fn netns_mode() -> io::Result<NetnsMode> {
    let s = Socket::open()?;
    for p in s.request(CMD_SYS_GET, false, &[])? {
        if let Some(m) = parse_netns_mode(&p)? {
            return Ok(m);
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENODATA))
}

/// The RDMA devices of the calling thread's network namespace.
///
/// # Errors
///
/// As [`netns_mode`].
pub fn devices() -> io::Result<Vec<NlDevice>> {
    let s = Socket::open()?;
    let mut out = Vec::new();
    for p in s.request(CMD_GET, true, &[])? {
        out.push(parse_device(&p)?);
    }
    Ok(out)
}

/// The `uverbs` character device of device `index`, if it has one.
///
/// # Errors
///
/// As [`netns_mode`]; a device without one reports `ENOENT`/`EOPNOTSUPP`,
/// which is `Ok(None)` here.
pub fn uverbs_chardev(index: u32) -> io::Result<Option<NlChardev>> {
    let s = Socket::open()?;
    let idx = index.to_ne_bytes();
    let attrs: [(u16, &[u8]); 2] = [(ATTR_DEV_INDEX, &idx), (ATTR_CHARDEV_TYPE, b"uverbs\0")];
    match s.request(CMD_GET_CHARDEV, false, &attrs) {
        Ok(replies) => {
            for p in replies {
                if let Some(c) = parse_chardev(&p)? {
                    return Ok(Some(c));
                }
            }
            Ok(None)
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `RDMA_NLDEV_CMD_SYS_GET` reply as the kernel (6.x) sends it for
    /// `rdma system show` in exclusive mode, followed by its ACK: attribute
    /// NETNS_MODE (66) = 0, COPY_ON_FORK (93) = 1, sequence 7.
    const SYS_REPLY_EXCLUSIVE: [u8; 32 + 36] = [
        // nlmsghdr: len 32, type 0x1406, flags 0, seq 7, pid 0
        32, 0, 0, 0, 0x06, 0x14, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, //
        // nla len 5, type 66 (u8 0) + 3 pad
        5, 0, 66, 0, 0, 0, 0, 0, //
        // nla len 5, type 93 (u8 1) + 3 pad
        5, 0, 93, 0, 1, 0, 0, 0, //
        // NLMSG_ERROR (ack): len 36, type 2, flags 0x100, seq 7, pid 0
        36, 0, 0, 0, 2, 0, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0, //
        // error 0, then the request's header
        0, 0, 0, 0, 16, 0, 0, 0, 0x06, 0x14, 5, 0, 7, 0, 0, 0, 0, 0, 0, 0,
    ];

    /// One message of a `RDMA_NLDEV_CMD_GET` dump (`rdma dev show`):
    /// index 3, "mlx5_1", ports 1, node GUID 0x248a07030049d469 (the sysfs
    /// form 248a:0703:0049:d469), protocol "roce".
    fn dev_message(seq: u32) -> Vec<u8> {
        let guid = 0x248a_0703_0049_d469u64.to_ne_bytes();
        build(
            nl_type(CMD_GET),
            2, // NLM_F_MULTI
            seq,
            &[
                (ATTR_DEV_INDEX, &3u32.to_ne_bytes()),
                (ATTR_DEV_NAME, b"mlx5_1\0"),
                (ATTR_PORT_INDEX, &1u32.to_ne_bytes()),
                (4, &0x1234u64.to_ne_bytes()), // CAP_FLAGS: ignored
                (5, b"16.35.2000\0"),          // FW_VERSION: ignored
                (0, &[]),                      // PAD
                (ATTR_NODE_GUID, &guid),
                (ATTR_DEV_PROTOCOL, b"roce\0"),
            ],
        )
    }

    #[test]
    fn sys_get_reply_gives_the_mode() {
        let mut out = Vec::new();
        assert_eq!(collect_replies(&SYS_REPLY_EXCLUSIVE, 7, &mut out).unwrap(), Some(()));
        assert_eq!(out.len(), 1);
        assert_eq!(parse_netns_mode(&out[0]).unwrap(), Some(NetnsMode::Exclusive));
        let mut shared = SYS_REPLY_EXCLUSIVE;
        shared[20] = 1;
        let m = messages(&shared).unwrap();
        assert_eq!((m[0].ty, m[0].seq), (nl_type(CMD_SYS_GET), 7));
        assert_eq!(parse_netns_mode(m[0].payload).unwrap(), Some(NetnsMode::Shared));
        // Another request's replies are skipped; without the attribute: None.
        let mut out = Vec::new();
        assert_eq!(collect_replies(&SYS_REPLY_EXCLUSIVE, 8, &mut out).unwrap(), None);
        assert!(out.is_empty());
        assert_eq!(parse_netns_mode(&[]).unwrap(), None);
    }

    #[test]
    fn device_dump_parses_and_ends_at_done() {
        let mut dgram = dev_message(9);
        assert_eq!(messages(&dgram).unwrap().len(), 1);
        // A second device: index 4, name "rxe0", nothing else.
        let second = build(
            nl_type(CMD_GET),
            2,
            9,
            &[(ATTR_DEV_INDEX, &4u32.to_ne_bytes()), (ATTR_DEV_NAME, b"rxe0\0")],
        );
        dgram.extend_from_slice(&second);
        let mut out = Vec::new();
        assert_eq!(collect_replies(&dgram, 9, &mut out).unwrap(), None, "no DONE yet");
        let done = build(NLMSG_DONE, 2, 9, &[(0, &0i32.to_ne_bytes())]);
        assert_eq!(collect_replies(&done, 9, &mut out).unwrap(), Some(()));
        let devs: Vec<NlDevice> = out.iter().map(|p| parse_device(p).unwrap()).collect();
        assert_eq!(
            devs[0],
            NlDevice {
                index: 3,
                name: "mlx5_1".into(),
                node_guid: Some(0x248a_0703_0049_d469),
                ports: Some(1),
                protocol: Some("roce".into()),
            }
        );
        assert_eq!(
            (devs[1].index, devs[1].name.as_str(), devs[1].node_guid),
            (4, "rxe0", None)
        );
    }

    #[test]
    fn errors_and_malformed_data() {
        // NLMSG_ERROR -EPERM (rdma system set without CAP_NET_ADMIN).
        let err = build(NLMSG_ERROR, 0, 5, &[]);
        let mut e = err.clone();
        e.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        let len = e.len() as u32;
        e[0..4].copy_from_slice(&len.to_ne_bytes());
        let mut out = Vec::new();
        let got = collect_replies(&e, 5, &mut out).unwrap_err();
        assert_eq!(got.raw_os_error(), Some(libc::EPERM));
        // Truncated header length, attribute overrun, missing fields.
        assert!(messages(&[200, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(messages(&[1, 2, 3]).is_err());
        assert!(attrs(&[9, 0, 1, 0, 0]).is_err());
        assert!(parse_device(&[8, 0, ATTR_DEV_INDEX as u8, 0, 1, 0, 0, 0]).is_err());
        assert!(
            parse_device(&[6, 0, ATTR_DEV_INDEX as u8, 0, 1, 0, 0, 0]).is_err(),
            "short u32"
        );
        assert!(collect_replies(&[1, 2, 3, 4], 1, &mut out).is_err());
        // Flag bits on the attribute type are ignored.
        let nested = [8, 0, ATTR_DEV_INDEX as u8, 0x80, 5, 0, 0, 0];
        assert_eq!(attrs(&nested).unwrap(), vec![(ATTR_DEV_INDEX, &[5u8, 0, 0, 0][..])]);
    }

    #[test]
    fn chardev_reply_and_request_layout() {
        let reply = build(
            nl_type(CMD_GET_CHARDEV),
            0,
            3,
            &[
                (ATTR_CHARDEV_NAME, b"uverbs1\0"),
                (71, &1u64.to_ne_bytes()), // CHARDEV_ABI
                (ATTR_CHARDEV, &((231u64 << 8) | 193).to_ne_bytes()),
            ],
        );
        let m = messages(&reply).unwrap();
        let c = parse_chardev(m[0].payload).unwrap().unwrap();
        assert_eq!(c.name, "uverbs1");
        assert_eq!(c.dev, Some((231 << 8) | 193));
        assert_eq!(parse_chardev(&[]).unwrap(), None);
        // A request: 16-byte header, attributes padded to 4 bytes.
        let req = build(
            nl_type(CMD_SYS_GET),
            NLM_F_REQUEST | NLM_F_ACK,
            1,
            &[(ATTR_DEV_NAME, b"ab\0")],
        );
        assert_eq!(req.len(), 16 + 8);
        assert_eq!(u32::from_ne_bytes(req[0..4].try_into().unwrap()), 24);
        assert_eq!(u16::from_ne_bytes([req[4], req[5]]), (5 << 10) + 6);
        assert_eq!(
            u16::from_ne_bytes([req[16], req[17]]),
            7,
            "attribute length excludes padding"
        );
    }

    /// Whether this kernel has the RDMA core loaded (a module or built in:
    /// `ib_core` has parameters, so it is under `/sys/module` either way).
    /// `NETLINK_RDMA` is registered by `ib_core` and by nothing else.
    fn ib_core_loaded() -> bool {
        std::path::Path::new("/sys/module/ib_core").exists()
    }

    /// The live queries against this machine's kernel, checked against what
    /// sysfs says independently: without `ib_core` both fail with exactly
    /// `EPROTONOSUPPORT` (the socket's protocol is not registered); with it
    /// the mode matches the `ib_core` parameter (the same variable `rdma
    /// system set netns` changes) and every device listed is a distinct,
    /// named entry of `/sys/class/infiniband` with its uverbs node query
    /// answered. (`ib_core` is checked after the queries: opening the
    /// socket may load it.)
    #[test]
    fn live_queries_agree_with_sysfs() {
        let mode = netns_mode();
        let devs = devices();
        if !ib_core_loaded() {
            for (what, e) in [("netns_mode", mode.err()), ("devices", devs.err())] {
                let e = e.unwrap_or_else(|| panic!("{what} answered without an RDMA core in the kernel"));
                assert_eq!(e.raw_os_error(), Some(libc::EPROTONOSUPPORT), "{what}: {e}");
            }
            println!("no RDMA core in this kernel: both queries fail with EPROTONOSUPPORT");
            return;
        }
        let mode = mode.expect("RDMA netlink with ib_core loaded");
        match crate::hw::sysfs::netns_mode(std::path::Path::new("/sys")) {
            Ok(param) => assert_eq!(mode, param, "netlink and the ib_core parameter disagree"),
            Err(e) => println!("SKIP comparing the mode with the ib_core parameter: {e}"),
        }
        let devs = devs.expect("RDMA netlink device dump");
        let mut names = std::collections::BTreeSet::new();
        let mut indexes = std::collections::BTreeSet::new();
        for d in &devs {
            assert!(!d.name.is_empty(), "{d:?}");
            assert!(names.insert(d.name.clone()), "device {} listed twice", d.name);
            assert!(indexes.insert(d.index), "index {} listed twice", d.index);
            assert!(d.ports.is_none_or(|p| p >= 1), "{d:?}");
            // sysfs shows the namespace it was mounted in, which for a test
            // process is its own.
            assert!(
                std::path::Path::new("/sys/class/infiniband").join(&d.name).exists(),
                "{} is not in /sys/class/infiniband",
                d.name
            );
            uverbs_chardev(d.index).unwrap_or_else(|e| panic!("uverbs node of {}: {e}", d.name));
        }
        println!("RDMA netns mode {mode}; {} device(s): {names:?}", devs.len());
    }
}
