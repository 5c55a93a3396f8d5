//! `librdmacm.so.1` through the dynamic linker, as a C program sees it:
//! the verbs library and this one loaded with `dlopen`, the `rdma_*`
//! calls looked up by name and rdma-core's version, forwarded into the
//! verbs library. One process connects to itself (a listener and a
//! client on its one soft device) and checks what a C program relies on:
//! the event channel's descriptor is pollable and honours `O_NONBLOCK`,
//! events carry the ids, the listener and the private data, the ids'
//! `verbs`/`pd`/`qp`/CQs are the verbs library's objects (a SEND goes
//! through them), a destroyed id is refused, unsupported calls fail with
//! the documented errno, an address removal gives ADDR_CHANGE and a hot
//! unplug DEVICE_REMOVAL. One test, in phases: the device is the process's.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use softverbs_ibverbs::ffi::*;
use softverbs_ibverbs::rdmacm::ffi::*;

fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    [dir.join(name), dir.join("deps").join(name)]
        .into_iter()
        .filter(|p| p.exists())
        // `cargo test` refreshes deps/ only; `cargo build` also the copy
        // above it: the newer one is this build's.
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("cargo built {name}"))
}

struct Lib(*mut c_void);

impl Lib {
    fn open(path: &Path, flags: c_int) -> Lib {
        let c = CString::new(path.to_str().expect("utf-8 path")).expect("path");
        // SAFETY: loading this workspace's own libraries.
        let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
        assert!(!h.is_null(), "dlopen {path:?} failed");
        Lib(h)
    }

    /// `name` at version `ver`, as a function pointer of type `T`.
    fn sym<T: Copy>(&self, name: &str, ver: &str) -> T {
        let (n, v) = (CString::new(name).expect("name"), CString::new(ver).expect("ver"));
        // SAFETY: a valid handle and strings.
        let p = unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) };
        assert!(!p.is_null(), "{name}@{ver} not exported");
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: T is the function pointer type of `name` (the caller's
        // promise), the same size as a pointer.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn sockaddr(ip: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

type CreateChannel = unsafe extern "C" fn() -> *mut rdma_event_channel;
type GetEvent = unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
type AckEvent = unsafe extern "C" fn(*mut rdma_cm_event) -> c_int;
type CreateId = unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, c_int) -> c_int;
type IdCall = unsafe extern "C" fn(*mut rdma_cm_id) -> c_int;
type IdInt = unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int;
type BindAddr = unsafe extern "C" fn(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int;
type ResolveAddr = unsafe extern "C" fn(*mut rdma_cm_id, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
type Connect = unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut rdma_cm_id);
type GetAddrInfo =
    unsafe extern "C" fn(*const c_char, *const c_char, *const rdma_addrinfo, *mut *mut rdma_addrinfo) -> c_int;
type FreeAddrInfo = unsafe extern "C" fn(*mut rdma_addrinfo);
type EventStr = unsafe extern "C" fn(c_int) -> *const c_char;
type JoinMc = unsafe extern "C" fn(*mut rdma_cm_id, *mut libc::sockaddr, *mut c_void) -> c_int;
type Rsocket = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type CreateCq = unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;

/// Waits (poll(2), bounded) until the channel's descriptor is readable,
/// then takes the event; checks its type.
fn next(get: GetEvent, ch: *mut rdma_event_channel, want: c_int) -> *mut rdma_cm_event {
    // SAFETY: a live channel.
    let fd = unsafe { (*ch).fd };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 20_000) };
    assert_eq!(n, 1, "the channel's descriptor became readable");
    let mut ev = null_mut();
    // SAFETY: a live channel and a writable pointer.
    assert_eq!(unsafe { get(ch, &mut ev) }, 0, "rdma_get_cm_event: errno {}", errno());
    // SAFETY: the event just returned.
    let e = unsafe { &*ev };
    assert_eq!(e.event, want, "event {} (status {})", e.event, e.status);
    ev
}

#[test]
fn rdma_cm_through_the_dynamic_linker() {
    // This process's soft device: its own loopback address on the
    // standard port, so its GID is the one rdma_cm's addresses map to.
    let a = (std::process::id() % 200) as u8 + 20;
    let ip = std::net::Ipv4Addr::new(127, a, 250, 1);
    std::env::set_var("SOFTVERBS_ADDR", ip.to_string());
    std::env::set_var("SOFTVERBS_PORT", "4791");
    std::env::set_var("SOFTVERBS_LINK", "udp");
    // The verbs library first (global, under its SONAME libibverbs.so.1),
    // so that librdmacm's constructor finds it by that name.
    let verbs = Lib::open(&built("libsoftverbs_ibverbs.so"), libc::RTLD_NOW | libc::RTLD_GLOBAL);
    let cm = Lib::open(&built("libsoftverbs_rdmacm.so"), libc::RTLD_NOW | libc::RTLD_LOCAL);
    let v1 = "RDMACM_1.0";
    let create_channel: CreateChannel = cm.sym("rdma_create_event_channel", v1);
    let destroy_channel: unsafe extern "C" fn(*mut rdma_event_channel) = cm.sym("rdma_destroy_event_channel", v1);
    let get: GetEvent = cm.sym("rdma_get_cm_event", v1);
    let ack: AckEvent = cm.sym("rdma_ack_cm_event", v1);
    let create_id: CreateId = cm.sym("rdma_create_id", v1);
    let destroy_id: IdCall = cm.sym("rdma_destroy_id", v1);
    let bind: BindAddr = cm.sym("rdma_bind_addr", v1);
    let listen: IdInt = cm.sym("rdma_listen", v1);
    let resolve_addr: ResolveAddr = cm.sym("rdma_resolve_addr", v1);
    let resolve_route: IdInt = cm.sym("rdma_resolve_route", v1);
    let create_qp: CreateQp = cm.sym("rdma_create_qp", v1);
    let destroy_qp: DestroyQp = cm.sym("rdma_destroy_qp", v1);
    let connect: Connect = cm.sym("rdma_connect", v1);
    let accept: Connect = cm.sym("rdma_accept", v1);
    let disconnect: IdCall = cm.sym("rdma_disconnect", v1);
    let getaddrinfo: GetAddrInfo = cm.sym("rdma_getaddrinfo", v1);
    let freeaddrinfo: FreeAddrInfo = cm.sym("rdma_freeaddrinfo", v1);
    let event_str: EventStr = cm.sym("rdma_event_str", v1);
    let join_mc: JoinMc = cm.sym("rdma_join_multicast", v1);
    let rsocket: Rsocket = cm.sym("rsocket", v1);
    let init_qp_attr: unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_qp_attr, *mut c_int) -> c_int =
        cm.sym("rdma_init_qp_attr", "RDMACM_1.2");
    let _: IdCall = cm.sym("rdma_establish", "RDMACM_1.2");
    let _: IdCall = cm.sym("rdma_get_remote_ece", "RDMACM_1.3");
    let create_cq: CreateCq = verbs.sym("ibv_create_cq", "IBVERBS_1.1");
    let reg_mr: RegMr = verbs.sym("ibv_reg_mr", "IBVERBS_1.1");

    // SAFETY: every call below is a C entry point called with the
    // arguments its rdma_cma.h / verbs.h declaration requires; the objects
    // passed are live ones this test made.
    unsafe {
        assert_eq!(
            CStr::from_ptr(event_str(RDMA_CM_EVENT_ESTABLISHED)).to_str(),
            Ok("RDMA_CM_EVENT_ESTABLISHED")
        );
        let ch = create_channel();
        assert!(!ch.is_null());
        // O_NONBLOCK on the descriptor: no event is EAGAIN.
        let fd = (*ch).fd;
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK), 0);
        let mut ev = null_mut();
        assert_eq!(get(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EAGAIN);

        // A listener and a client on the process's device.
        let mut l = null_mut();
        let lctx = 0x1234usize as *mut c_void;
        assert_eq!(create_id(ch, &mut l, lctx, RDMA_PS_TCP), 0);
        let port = 20000 + (std::process::id() % 20000) as u16;
        let mut la = sockaddr(ip, port);
        assert_eq!(
            bind(l, &mut la as *mut _ as *mut libc::sockaddr),
            0,
            "errno {}",
            errno()
        );
        assert_eq!(listen(l, 4), 0);
        assert!(!(*l).verbs.is_null(), "bound to the device's address");

        let mut c = null_mut();
        assert_eq!(create_id(ch, &mut c, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(
            resolve_addr(c, null_mut(), &mut la as *mut _ as *mut libc::sockaddr, 2000),
            0
        );
        let e = next(get, ch, RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!((*e).id, c);
        assert_eq!(ack(e), 0);
        assert_eq!(resolve_route(c, 2000), 0);
        let e = next(get, ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
        assert_eq!(ack(e), 0);
        assert!(!(*c).verbs.is_null() && !(*c).pd.is_null(), "the id has its device");
        assert_eq!((*(*c).pd).context, (*c).verbs);
        assert_eq!(u16::from_be(port_of(&(*c).route.addr.dst_storage)), port);
        assert_eq!((*c).route.num_paths, 1);

        // The client's QP: rdma_create_qp makes its CQs when given none.
        let mut attr = qp_attr(null_mut());
        assert_eq!(create_qp(c, null_mut(), &mut attr), 0, "errno {}", errno());
        assert!(!(*c).qp.is_null() && !(*c).send_cq.is_null() && !(*c).send_cq_channel.is_null());
        assert_eq!((*(*c).qp).state, 1, "rdma_create_qp moved the QP to INIT");
        let hello = *b"hello";
        let mut param: rdma_conn_param = std::mem::zeroed();
        param.private_data = hello.as_ptr() as *const c_void;
        param.private_data_len = hello.len() as u8;
        param.responder_resources = 1;
        param.initiator_depth = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        assert_eq!(connect(c, &mut param), 0, "errno {}", errno());

        // The request: the new id, its listener, the private data.
        let e = next(get, ch, RDMA_CM_EVENT_CONNECT_REQUEST);
        assert_eq!((*e).listen_id, l);
        let s = (*e).id;
        assert!(!s.is_null() && s != l && s != c);
        assert_eq!((*s).context, lctx, "a request's id has its listener's context");
        assert_eq!((*s).verbs, (*c).verbs, "one context per device");
        let conn = (*e).param.conn;
        assert!(conn.private_data_len as usize >= hello.len());
        assert_eq!(std::slice::from_raw_parts(conn.private_data as *const u8, 5), b"hello");
        assert_eq!(ack(e), 0);
        let scq = create_cq((*s).verbs, 8, null_mut(), null_mut(), 0);
        assert!(!scq.is_null());
        let mut sattr = qp_attr(scq);
        assert_eq!(create_qp(s, null_mut(), &mut sattr), 0);
        let mut buf = [0u8; 64];
        let mr = reg_mr((*s).pd, buf.as_mut_ptr() as *mut c_void, buf.len(), 1);
        assert!(!mr.is_null());
        let mut sge = ibv_sge {
            addr: buf.as_mut_ptr() as u64,
            length: buf.len() as u32,
            lkey: (*mr).lkey,
        };
        let mut rwr: ibv_recv_wr = std::mem::zeroed();
        rwr.wr_id = 7;
        rwr.sg_list = &mut sge;
        rwr.num_sge = 1;
        let mut bad = null_mut();
        let ops = &(*(*s).verbs).ops;
        assert_eq!(ops.post_recv.expect("post_recv")((*s).qp, &mut rwr, &mut bad), 0);
        let mut none: rdma_conn_param = std::mem::zeroed();
        none.responder_resources = 1;
        none.initiator_depth = 1;
        assert_eq!(accept(s, &mut none), 0, "errno {}", errno());
        let mut established = Vec::new();
        for _ in 0..2 {
            let e = next(get, ch, RDMA_CM_EVENT_ESTABLISHED);
            established.push((*e).id);
            assert_eq!(ack(e), 0);
        }
        established.sort();
        let mut both = vec![c, s];
        both.sort();
        assert_eq!(established, both);
        assert_eq!(((*(*c).qp).state, (*(*s).qp).state), (3, 3), "both QPs in RTS");

        // rdma_init_qp_attr: what an application driving its own QP would
        // apply, state by state (IBV_QP_STATE = 1, IBV_QP_DEST_QPN = 1 << 20,
        // IBV_QP_SQ_PSN = 1 << 16); other states are refused.
        let mut qa: ibv_qp_attr = std::mem::zeroed();
        let mut mask: c_int = 0;
        for (state, want) in [(1u32, 1 | (1 << 4)), (2, 1 | (1 << 20)), (3, 1 | (1 << 16))] {
            qa.qp_state = state;
            assert_eq!(
                init_qp_attr(c, &mut qa, &mut mask),
                0,
                "state {state}: errno {}",
                errno()
            );
            assert_eq!(qa.qp_state, state);
            assert_eq!(mask & want, want, "state {state}: mask {mask:#x}");
        }
        qa.qp_state = 2;
        assert_eq!(init_qp_attr(c, &mut qa, &mut mask), 0);
        assert_eq!(qa.dest_qp_num, (*(*s).qp).qp_num, "RTR names the peer's QP");
        qa.qp_state = 6;
        assert_eq!(init_qp_attr(c, &mut qa, &mut mask), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(init_qp_attr(c, null_mut(), &mut mask), -1);
        assert_eq!(errno(), libc::EINVAL);

        // A SEND through the ids' objects: inline data from the client.
        let msg = *b"ping";
        let mut ssge = ibv_sge {
            addr: msg.as_ptr() as u64,
            length: 4,
            lkey: 0,
        };
        let mut swr: ibv_send_wr = std::mem::zeroed();
        swr.wr_id = 9;
        swr.sg_list = &mut ssge;
        swr.num_sge = 1;
        swr.opcode = 2; // IBV_WR_SEND
        swr.send_flags = 2 | 8; // IBV_SEND_SIGNALED | IBV_SEND_INLINE
        let mut sbad = null_mut();
        assert_eq!(ops.post_send.expect("post_send")((*c).qp, &mut swr, &mut sbad), 0);
        let poll = ops.poll_cq.expect("poll_cq");
        for (cq, id) in [(scq, 7u64), ((*c).send_cq, 9u64)] {
            let mut wc: ibv_wc = std::mem::zeroed();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while poll(cq, 1, &mut wc) == 0 {
                assert!(std::time::Instant::now() < deadline, "no completion");
                std::thread::yield_now();
            }
            assert_eq!((wc.status, wc.wr_id), (0, id));
        }
        assert_eq!(&buf[..4], b"ping");

        // Disconnect: both sides hear of it.
        assert_eq!(disconnect(c), 0);
        for _ in 0..2 {
            let e = next(get, ch, RDMA_CM_EVENT_DISCONNECTED);
            assert_eq!(ack(e), 0);
        }
        assert_eq!(disconnect(s), 0, "disconnecting after the peer did succeeds");

        // Unsupported calls fail with their errno, never abort.
        let mut mc = sockaddr(std::net::Ipv4Addr::new(224, 0, 0, 1), 0);
        assert_eq!(join_mc(c, &mut mc as *mut _ as *mut libc::sockaddr, null_mut()), -1);
        assert_eq!(errno(), libc::EOPNOTSUPP);
        assert_eq!(rsocket(libc::AF_INET, libc::SOCK_STREAM, 0), -1);
        assert_eq!(errno(), libc::ENOSYS);

        destroy_qp(s);
        destroy_qp(c);
        for id in [s, c, l] {
            assert_eq!(destroy_id(id), 0);
        }
        // A destroyed id is refused, not read.
        assert_eq!(listen(l, 1), -1);
        assert_eq!(errno(), libc::EINVAL);

        // Hot unplug of the device: an id on it gets DEVICE_REMOVAL, and
        // destroying it afterwards succeeds.
        let mut r = null_mut();
        assert_eq!(create_id(ch, &mut r, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(
            resolve_addr(r, null_mut(), &mut la as *mut _ as *mut libc::sockaddr, 2000),
            0
        );
        assert_eq!(ack(next(get, ch, RDMA_CM_EVENT_ADDR_RESOLVED)), 0);
        let remove: unsafe extern "C" fn(*const c_char) -> c_int = {
            let n = CString::new("softverbs_remove_device").unwrap();
            let p = libc::dlsym(verbs.0, n.as_ptr());
            assert!(!p.is_null());
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char) -> c_int>(p)
        };
        let name = CStr::from_ptr((*(*(*r).verbs).device).name.as_ptr()).to_owned();
        // The address goes away first: ADDR_CHANGE for the id, once.
        let remove_addr: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int = {
            let n = CString::new("softverbs_remove_addr").unwrap();
            let p = libc::dlsym(verbs.0, n.as_ptr());
            assert!(!p.is_null());
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char, *const c_char) -> c_int>(p)
        };
        let text = CString::new(ip.to_string()).unwrap();
        assert_eq!(remove_addr(name.as_ptr(), text.as_ptr()), 0);
        let e = next(get, ch, RDMA_CM_EVENT_ADDR_CHANGE);
        assert_eq!((*e).id, r);
        assert_eq!(ack(e), 0);
        assert_eq!(remove_addr(name.as_ptr(), text.as_ptr()), 0, "reported twice");
        let bad = CString::new("not an address").unwrap();
        assert_eq!(remove_addr(name.as_ptr(), bad.as_ptr()), -1);
        assert_eq!(errno(), libc::EINVAL);
        let other = CString::new("no_such_device").unwrap();
        assert_eq!(remove_addr(other.as_ptr(), text.as_ptr()), -1);
        assert_eq!(errno(), libc::ENOENT);
        // Then the device: DEVICE_REMOVAL is the next event (no second
        // ADDR_CHANGE came before it).
        assert_eq!(remove(name.as_ptr()), 0);
        let e = next(get, ch, RDMA_CM_EVENT_DEVICE_REMOVAL);
        assert_eq!((*e).id, r);
        assert_eq!(ack(e), 0);
        assert_eq!(destroy_id(r), 0);
        destroy_channel(ch);
        // A destroyed channel is refused, and destroying it again is
        // harmless (perftest's error path does it).
        assert_eq!(get(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EINVAL);
        destroy_channel(ch);

        // rdma_getaddrinfo: a numeric destination and a passive wildcard.
        let mut res = null_mut();
        let node = CString::new("127.0.0.1").unwrap();
        let service = CString::new("7471").unwrap();
        assert_eq!(getaddrinfo(node.as_ptr(), service.as_ptr(), null(), &mut res), 0);
        assert_eq!((*res).ai_port_space, RDMA_PS_TCP);
        assert_eq!((*res).ai_qp_type, IBV_QPT_RC);
        let dst = &*((*res).ai_dst_addr as *const libc::sockaddr_in);
        assert_eq!(
            (u16::from_be(dst.sin_port), u32::from_be(dst.sin_addr.s_addr)),
            (7471, 0x7f00_0001)
        );
        freeaddrinfo(res);
        let mut hints: rdma_addrinfo = std::mem::zeroed();
        hints.ai_flags = RAI_PASSIVE;
        hints.ai_port_space = RDMA_PS_UDP;
        assert_eq!(getaddrinfo(null(), service.as_ptr(), &hints, &mut res), 0);
        assert!((*res).ai_dst_addr.is_null() && !(*res).ai_src_addr.is_null());
        assert_eq!((*res).ai_qp_type, IBV_QPT_UD);
        freeaddrinfo(res);
    }
}

fn port_of(s: &libc::sockaddr_storage) -> u16 {
    // SAFETY: an AF_INET address is a sockaddr_in.
    unsafe { (*(s as *const libc::sockaddr_storage as *const libc::sockaddr_in)).sin_port }
}

fn qp_attr(cq: *mut ibv_cq) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        },
        qp_type: IBV_QPT_RC as u32,
        sq_sig_all: 0,
    }
}
