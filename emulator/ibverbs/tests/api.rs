//! The built library through the dynamic linker, as a C program sees it:
//! `dlopen` of the cdylib, symbols looked up by name and version, the
//! data path called through `ibv_context_ops` as the static inlines of
//! `verbs.h` do. One test, in phases, because the last phase removes the
//! process's device.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int, c_uint};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

use softverbs_ibverbs::ffi::*;

struct Lib(*mut c_void);

impl Lib {
    fn open() -> Lib {
        let exe = std::env::current_exe().expect("test executable");
        let dir = exe.parent().and_then(|p| p.parent()).expect("target dir");
        let path: PathBuf = [
            dir.join("libsoftverbs_ibverbs.so"),
            dir.join("deps/libsoftverbs_ibverbs.so"),
        ]
        .into_iter()
        .filter(|p| p.exists())
        // `cargo test` refreshes deps/ only; `cargo build` also the copy
        // above it: the newer one is this build's.
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("cargo built libsoftverbs_ibverbs.so");
        let c = CString::new(path.to_str().expect("utf-8 path")).expect("path");
        // SAFETY: loading our own library; its constructors are Rust's.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen failed");
        Lib(h)
    }

    /// The default version of `name`, as a function pointer of type `T`.
    fn sym<T: Copy>(&self, name: &str) -> T {
        let c = CString::new(name).expect("name");
        // SAFETY: a valid handle and name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "{name} not exported");
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: T is the function pointer type of `name` (the caller's
        // promise), the same size as a pointer.
        unsafe { std::mem::transmute_copy(&p) }
    }

    /// Version `ver` of `name`, as a function pointer of type `T`.
    fn vsym<T: Copy>(&self, name: &str, ver: &str) -> T {
        let (n, v) = (CString::new(name).expect("name"), CString::new(ver).expect("ver"));
        // SAFETY: a valid handle and strings.
        let p = unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) };
        assert!(!p.is_null(), "{name}@{ver} not exported");
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: T is the function pointer type of that version of `name`
        // (the caller's promise), the same size as a pointer.
        unsafe { std::mem::transmute_copy(&p) }
    }

    /// Whether `name` exists with version `ver`.
    fn has_version(&self, name: &str, ver: &str) -> bool {
        let (n, v) = (CString::new(name).expect("name"), CString::new(ver).expect("ver"));
        // SAFETY: a valid handle and strings.
        !unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) }.is_null()
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

type GetList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
type FreeList = unsafe extern "C" fn(*mut *mut ibv_device);
type Open = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
type Close = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCq = unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
type GetAsync = unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
type AckAsync = unsafe extern "C" fn(*mut ibv_async_event);
type Remove = unsafe extern "C" fn(*const c_char) -> c_int;
type StrFn = unsafe extern "C" fn(c_uint) -> *const c_char;

type GetCqEvent = unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;

/// Runs `f` on another thread and fails the test if it has not returned
/// within 30 s (a call that should not block, blocking).
fn within<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

/// Sets or clears `O_NONBLOCK` on `fd`.
fn set_nonblocking(fd: c_int, on: bool) {
    // SAFETY: flag changes on a descriptor the library handed out.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert!(fl >= 0);
        let fl = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl), 0);
    }
}

fn s(p: *const c_char) -> String {
    // SAFETY: the library returns static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[test]
fn c_abi_misuse_bad_wr_and_hot_unplug() {
    let lib = Lib::open();

    // Versions: the names binaries are linked against.
    for (name, ver) in [
        ("ibv_get_device_list", "IBVERBS_1.1"),
        ("ibv_create_comp_channel", "IBVERBS_1.0"),
        ("ibv_qp_to_qp_ex", "IBVERBS_1.6"),
        ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
        ("_ibv_query_gid_ex", "IBVERBS_1.11"),
        ("ibv_query_qp_data_in_order", "IBVERBS_1.14"),
        ("ibv_query_gid_type", "IBVERBS_PRIVATE_34"),
        ("verbs_register_driver_34", "IBVERBS_PRIVATE_34"),
    ] {
        assert!(lib.has_version(name, ver), "{name}@{ver}");
    }

    let wc_str: StrFn = lib.sym("ibv_wc_status_str");
    let ev_str: StrFn = lib.sym("ibv_event_type_str");
    // SAFETY: plain C calls.
    unsafe {
        assert_eq!(s(wc_str(5)), "Work Request Flushed Error");
        assert_eq!(s(wc_str(999)), "unknown");
        assert_eq!(s(ev_str(8)), "local catastrophic error");
    }

    let get_list: GetList = lib.sym("ibv_get_device_list");
    let free_list: FreeList = lib.sym("ibv_free_device_list");
    let open: Open = lib.sym("ibv_open_device");
    let close: Close = lib.sym("ibv_close_device");
    let alloc_pd: AllocPd = lib.sym("ibv_alloc_pd");
    let dealloc_pd: DeallocPd = lib.sym("ibv_dealloc_pd");
    let reg_mr: RegMr = lib.sym("ibv_reg_mr");
    let dereg_mr: DeregMr = lib.sym("ibv_dereg_mr");
    let create_cq: CreateCq = lib.sym("ibv_create_cq");
    let destroy_cq: DestroyCq = lib.sym("ibv_destroy_cq");
    let create_qp: CreateQp = lib.sym("ibv_create_qp");
    let modify_qp: ModifyQp = lib.sym("ibv_modify_qp");
    let destroy_qp: DestroyQp = lib.sym("ibv_destroy_qp");
    let query_gid: QueryGid = lib.sym("ibv_query_gid");
    let get_async: GetAsync = lib.sym("ibv_get_async_event");
    let ack_async: AckAsync = lib.sym("ibv_ack_async_event");
    let remove: Remove = lib.sym("softverbs_remove_device");

    // SAFETY: the C API used as documented (and misused where the test
    // says so, in ways libibverbs reports rather than crashes on).
    unsafe {
        // Misuse: NULL objects fail with EINVAL.
        assert!(open(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(close(null_mut()), libc::EINVAL);

        let mut n = 0;
        let list = get_list(&mut n);
        assert_eq!(n, 1);
        let dev = *list;
        let ctx = open(dev);
        free_list(list);
        assert!(!ctx.is_null());

        // async_fd starts blocking, as the kernel's; with O_NONBLOCK set,
        // ibv_get_async_event returns -1/EAGAIN once nothing is pending
        // instead of blocking.
        assert_eq!(libc::fcntl((*ctx).async_fd, libc::F_GETFL) & libc::O_NONBLOCK, 0);
        set_nonblocking((*ctx).async_fd, true);
        let (c, ga, ack) = (ctx as usize, get_async as usize, ack_async as usize);
        let drained = within("ibv_get_async_event with O_NONBLOCK", move || {
            // The library's functions, an open context (the closure is
            // inside the test's unsafe block).
            let get_async: GetAsync = std::mem::transmute(ga);
            let ack_async: AckAsync = std::mem::transmute(ack);
            for _ in 0..16 {
                let mut ev: ibv_async_event = std::mem::zeroed();
                if get_async(c as *mut ibv_context, &mut ev) != 0 {
                    return Some(errno());
                }
                ack_async(&mut ev);
            }
            None
        });
        assert_eq!(drained, Some(libc::EAGAIN));
        set_nonblocking((*ctx).async_fd, false);

        // The verbs_context in front of the context, as the inlines find it.
        let off = std::mem::offset_of!(verbs_context, context);
        let vctx = &*((ctx as *mut u8).sub(off) as *const verbs_context);
        assert_eq!(vctx.sz, std::mem::size_of::<verbs_context>());
        let mut ex: ibv_device_attr_ex = std::mem::zeroed();
        let q = vctx.query_device_ex.expect("query_device_ex");
        assert_eq!(q(ctx, null(), &mut ex, std::mem::size_of::<ibv_device_attr_ex>()), 0);
        assert_eq!(ex.orig_attr.phys_port_cnt, 1);
        assert!(vctx.ibv_create_flow.is_none(), "flow steering is not offered");

        let pd = alloc_pd(ctx);
        assert!(!pd.is_null());
        let mut buf = vec![0u8; 4096];
        let mr = reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), 1 | 2 | 4);
        assert!(!mr.is_null());
        assert_eq!((*mr).addr, buf.as_mut_ptr().cast());
        // Remote write without local write breaks the registration rule.
        assert!(reg_mr(pd, buf.as_mut_ptr().cast(), 64, 2).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // A PD in use cannot go.
        assert_eq!(dealloc_pd(pd), libc::EBUSY);

        let cq = create_cq(ctx, 16, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        assert!(create_cq(ctx, 0, null_mut(), null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: 2,
            sq_sig_all: 1,
        };
        let qp = create_qp(pd, &mut init);
        assert!(!qp.is_null());

        // Connects an RC QP to itself (loopback through the device's link).
        let mut gid = ibv_gid::default();
        assert_eq!(query_gid(ctx, 1, 0, &mut gid), 0);
        let connect = |qp: *mut ibv_qp| {
            let mut a = ibv_qp_attr {
                qp_state: 1, // INIT
                port_num: 1,
                qp_access_flags: 1 | 2 | 4,
                ..Default::default()
            };
            assert_eq!(modify_qp(qp, &mut a, 1 | 16 | 32 | 8), 0);
            let mut a = ibv_qp_attr {
                qp_state: 2, // RTR
                path_mtu: 3,
                dest_qp_num: (*qp).qp_num,
                rq_psn: 7,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ibv_ah_attr {
                    is_global: 1,
                    grh: ibv_global_route {
                        dgid: gid,
                        hop_limit: 64,
                        ..Default::default()
                    },
                    port_num: 1,
                    ..Default::default()
                },
                ..Default::default()
            };
            assert_eq!(
                modify_qp(qp, &mut a, 1 | 128 | 256 | 1 << 20 | 1 << 12 | 1 << 17 | 1 << 15),
                0
            );
            let mut a = ibv_qp_attr {
                qp_state: 3, // RTS
                sq_psn: 7,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                ..Default::default()
            };
            assert_eq!(
                modify_qp(qp, &mut a, 1 | 1 << 16 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13),
                0
            );
        };
        connect(qp);
        assert_eq!((*qp).state, 3);

        // More misuse, each reported, none fatal.
        assert_eq!(destroy_cq(cq), libc::EBUSY, "a QP uses the CQ");
        let mut bad_gid = ibv_gid::default();
        assert_eq!(query_gid(ctx, 1, 9999, &mut bad_gid), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(query_gid(ctx, 2, 0, &mut bad_gid), -1, "port 2 does not exist");
        let mut a = ibv_qp_attr::default();
        assert_eq!(modify_qp(qp, &mut a, 1 << 30), libc::EINVAL, "unknown mask bit");
        a.qp_state = 2;
        assert_eq!(modify_qp(qp, &mut a, 1), libc::EINVAL, "RTS to RTR");
        assert_eq!((*qp).state, 3, "a failed modify changes nothing");
        let post_recv = (*ctx).ops.post_recv.expect("post_recv");
        assert_eq!(post_recv(null_mut(), null_mut(), null_mut()), libc::EINVAL);
        let create_ch: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel =
            lib.sym("ibv_create_comp_channel");
        let destroy_ch: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int = lib.sym("ibv_destroy_comp_channel");
        let ch = create_ch(ctx);
        assert!(!ch.is_null() && (*ch).fd >= 0);
        let cq_ch = create_cq(ctx, 4, null_mut(), ch, 0);
        assert!(!cq_ch.is_null());
        assert_eq!(destroy_ch(ch), libc::EBUSY, "a CQ uses the channel");
        // The channel's fd starts blocking; with O_NONBLOCK and no event
        // pending, -1/EAGAIN.
        assert_eq!(libc::fcntl((*ch).fd, libc::F_GETFL) & libc::O_NONBLOCK, 0);
        set_nonblocking((*ch).fd, true);
        let get_cq_event: GetCqEvent = lib.sym("ibv_get_cq_event");
        let (chp, gce) = (ch as usize, get_cq_event as usize);
        let r = within("ibv_get_cq_event with O_NONBLOCK", move || {
            // The library's function, a live channel.
            let get_cq_event: GetCqEvent = std::mem::transmute(gce);
            let (mut cq, mut cqc) = (null_mut(), null_mut());
            let r = get_cq_event(chp as *mut ibv_comp_channel, &mut cq, &mut cqc);
            (r, errno())
        });
        assert_eq!(r, (-1, libc::EAGAIN));
        assert_eq!(destroy_cq(cq_ch), 0);
        assert_eq!(destroy_ch(ch), 0);

        // A chain whose second WR has more SGEs than the QP allows: the
        // first is posted, bad_wr names the second, the third is not.
        let ops = &(*ctx).ops;
        let post_send = ops.post_send.expect("post_send");
        let poll_cq = ops.poll_cq.expect("poll_cq");
        let mut sge = [
            ibv_sge {
                addr: buf.as_ptr() as u64,
                length: 8,
                lkey: (*mr).lkey,
            },
            ibv_sge {
                addr: buf.as_ptr() as u64 + 8,
                length: 8,
                lkey: (*mr).lkey,
            },
        ];
        let sgl = sge.as_mut_ptr();
        let mk = |id: u64, nsge: c_int, next: *mut ibv_send_wr| {
            let mut w: ibv_send_wr = std::mem::zeroed();
            w.wr_id = id;
            w.next = next;
            w.sg_list = sgl;
            w.num_sge = nsge;
            w.opcode = IBV_WR_RDMA_WRITE;
            w.wr.rdma = wr_rdma {
                remote_addr: buf.as_ptr() as u64 + 1024,
                rkey: (*mr).rkey,
            };
            w
        };
        let mut w3 = mk(3, 1, null_mut());
        let mut w2 = mk(2, 2, &mut w3);
        let mut w1 = mk(1, 1, &mut w2);
        let mut bad: *mut ibv_send_wr = null_mut();
        assert_eq!(post_send(qp, &mut w1, &mut bad), libc::EINVAL);
        assert_eq!(bad, &mut w2 as *mut ibv_send_wr);
        let mut wc = [ibv_wc::default(); 4];
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.is_empty() && start.elapsed() < std::time::Duration::from_secs(30) {
            let k = poll_cq(cq, 4, wc.as_mut_ptr());
            assert!(k >= 0);
            got.extend_from_slice(&wc[..k as usize]);
        }
        assert_eq!(got.len(), 1, "only the first WR was posted");
        assert_eq!((got[0].wr_id, got[0].status, got[0].opcode), (1, 0, 1));
        assert_eq!(poll_cq(cq, -1, wc.as_mut_ptr()), -libc::EINVAL);

        // The extended CQ and QP: ibv_wr_* posting, start/next/end_poll.
        let vq = vctx.create_cq_ex.expect("create_cq_ex");
        let mut cattr = ibv_cq_init_attr_ex {
            cqe: 16,
            cq_context: null_mut(),
            channel: null_mut(),
            comp_vector: 0,
            wc_flags: 1, // IBV_WC_EX_WITH_BYTE_LEN
            comp_mask: 0,
            flags: 0,
            parent_domain: null_mut(),
        };
        let cqx = vq(ctx, &mut cattr);
        assert!(!cqx.is_null());
        cattr.wc_flags = 1 << 7; // completion timestamps: not offered
        assert!(vq(ctx, &mut cattr).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        let vqp = vctx.create_qp_ex.expect("create_qp_ex");
        let mut qattr: ibv_qp_init_attr_ex = std::mem::zeroed();
        qattr.send_cq = cqx as *mut ibv_cq;
        qattr.recv_cq = cqx as *mut ibv_cq;
        qattr.cap = init.cap;
        qattr.cap.max_inline_data = 64;
        qattr.qp_type = 2;
        qattr.sq_sig_all = 1;
        qattr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        qattr.pd = pd;
        qattr.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
        let qp2 = vqp(ctx, &mut qattr);
        assert!(!qp2.is_null());
        connect(qp2);
        let to_ex: unsafe extern "C" fn(*mut ibv_qp) -> *mut ibv_qp_ex = lib.sym("ibv_qp_to_qp_ex");
        let qx = to_ex(qp2);
        let mut rsge = ibv_sge {
            addr: buf.as_ptr() as u64 + 2048,
            length: 64,
            lkey: (*mr).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 77,
            next: null_mut(),
            sg_list: &mut rsge,
            num_sge: 1,
        };
        let mut rbad = null_mut();
        assert_eq!(ops.post_recv.expect("post_recv")(qp2, &mut rwr, &mut rbad), 0);
        buf[..4].copy_from_slice(b"abcd");
        let msg = *b"inline!";
        ((*qx).wr_start.expect("wr_start"))(qx);
        (*qx).wr_id = 10;
        ((*qx).wr_rdma_write.expect("wr_rdma_write"))(qx, (*mr).rkey, buf.as_ptr() as u64 + 3000);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        (*qx).wr_id = 11;
        ((*qx).wr_send.expect("wr_send"))(qx);
        ((*qx).wr_set_inline_data.expect("wr_set_inline_data"))(qx, msg.as_ptr() as *mut c_void, msg.len());
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), 0);
        let mut seen = Vec::new();
        let start = std::time::Instant::now();
        while seen.len() < 3 && start.elapsed() < std::time::Duration::from_secs(30) {
            let mut pa = ibv_poll_cq_attr { comp_mask: 0 };
            let mut r = ((*cqx).start_poll.expect("start_poll"))(cqx, &mut pa);
            if r == libc::ENOENT {
                continue;
            }
            while r == 0 {
                let op = ((*cqx).read_opcode.expect("read_opcode"))(cqx);
                let len = ((*cqx).read_byte_len.expect("read_byte_len"))(cqx);
                seen.push(((*cqx).wr_id, (*cqx).status, op, len));
                r = ((*cqx).next_poll.expect("next_poll"))(cqx);
            }
            assert_eq!(r, libc::ENOENT);
            ((*cqx).end_poll.expect("end_poll"))(cqx);
        }
        seen.sort();
        assert_eq!(seen, vec![(10, 0, 1, 4), (11, 0, 0, 7), (77, 0, 128, 7)]);
        assert_eq!(&buf[3000..3004], b"abcd");
        assert_eq!(&buf[2048..2055], b"inline!");
        // A setter without an operation first fails the batch.
        ((*qx).wr_start.expect("wr_start"))(qx);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), libc::EINVAL);

        // Completions of the extended CQ, until `n` or 30 s.
        let poll_ex = |n: usize| {
            let mut seen = Vec::new();
            let start = std::time::Instant::now();
            while seen.len() < n && start.elapsed() < std::time::Duration::from_secs(30) {
                let mut pa = ibv_poll_cq_attr { comp_mask: 0 };
                let mut r = ((*cqx).start_poll.expect("start_poll"))(cqx, &mut pa);
                if r == libc::ENOENT {
                    continue;
                }
                while r == 0 {
                    let op = ((*cqx).read_opcode.expect("read_opcode"))(cqx);
                    seen.push(((*cqx).wr_id, (*cqx).status, op));
                    r = ((*cqx).next_poll.expect("next_poll"))(cqx);
                }
                ((*cqx).end_poll.expect("end_poll"))(cqx);
            }
            seen
        };
        let write = |id: u64, off: u64| {
            (*qx).wr_id = id;
            ((*qx).wr_rdma_write.expect("wr_rdma_write"))(qx, (*mr).rkey, buf.as_ptr() as u64 + off);
        };
        // ibv_wr_complete posts all or nothing: a batch whose middle WR
        // has more SGEs than the QP allows fails and posts neither of the
        // valid ones around it; so does a batch longer than the queue.
        let over = vec![
            ibv_sge {
                addr: buf.as_ptr() as u64,
                length: 4,
                lkey: (*mr).lkey,
            };
            qattr.cap.max_send_sge as usize + 1
        ];
        ((*qx).wr_start.expect("wr_start"))(qx);
        write(20, 3100);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        write(21, 3200);
        ((*qx).wr_set_sge_list.expect("wr_set_sge_list"))(qx, over.len(), over.as_ptr());
        write(22, 3300);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), libc::EINVAL);
        ((*qx).wr_start.expect("wr_start"))(qx);
        for i in 0..=u64::from(qattr.cap.max_send_wr) {
            write(100 + i, 3400);
            ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        }
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), libc::ENOMEM);
        // A valid batch after them: its completion is the first one (the
        // QP completes in order, so a WR of the failed batches that had
        // been posted would come before it).
        ((*qx).wr_start.expect("wr_start"))(qx);
        write(23, 3500);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), 0);
        assert_eq!(poll_ex(1), vec![(23, 0, 1)], "nothing of the failed batches was posted");
        assert_eq!(&buf[3500..3504], b"abcd");
        assert_eq!(&buf[3100..3104], [0; 4], "WR 20 never ran");
        // A refusal only the provider makes (a message over max_msg_sz,
        // 2 GiB) at the end of the batch: nothing of it is posted. Then a
        // good batch: every WR, completing in the order built.
        ((*qx).wr_start.expect("wr_start"))(qx);
        for (id, len) in [(40, 4), (41, 4), (42, 0x8000_0001)] {
            write(id, 3700 + 16 * (id - 40));
            ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, len);
        }
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), libc::EINVAL);
        ((*qx).wr_start.expect("wr_start"))(qx);
        for id in 43..46 {
            write(id, 3700 + 16 * (id - 43));
            ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        }
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), 0);
        assert_eq!(
            poll_ex(3),
            vec![(43, 0, 1), (44, 0, 1), (45, 0, 1)],
            "only the good batch ran, in order"
        );

        // The batch reaches the send queue as one unit: the first WR's
        // error (a bad lkey) flushes the SEND after it before the posted
        // receive, as for a chain of ibv_post_send.
        (*rwr.sg_list).addr = buf.as_ptr() as u64 + 2560;
        rwr.wr_id = 78;
        assert_eq!(ops.post_recv.expect("post_recv")(qp2, &mut rwr, &mut rbad), 0);
        ((*qx).wr_start.expect("wr_start"))(qx);
        write(30, 3600);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey ^ 0x00ff_ff00, buf.as_ptr() as u64, 4);
        (*qx).wr_id = 31;
        ((*qx).wr_send.expect("wr_send"))(qx);
        ((*qx).wr_set_sge.expect("wr_set_sge"))(qx, (*mr).lkey, buf.as_ptr() as u64, 4);
        assert_eq!(((*qx).wr_complete.expect("wr_complete"))(qx), 0);
        let got = poll_ex(3);
        let ids: Vec<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(ids, vec![30, 31, 78], "{got:?}");
        assert!(got[0].1 != 0 && got[0].1 != 5, "WR 30 fails itself: {got:?}");
        assert_eq!((got[1].1, got[2].1), (5, 5), "the rest is flushed: {got:?}");
        assert_eq!(destroy_qp(qp2), 0);
        assert_eq!(destroy_cq(cqx as *mut ibv_cq), 0);

        // The IBVERBS_1.0 ABI, as a binary linked before 1.1 uses it.
        abi_1_0(&lib);

        // Hot unplug from outside the application.
        let name = CString::new("softverbs_0").expect("name");
        assert_eq!(remove(name.as_ptr()), 0);
        assert_eq!(remove(name.as_ptr()), -1);
        assert_eq!(errno(), libc::ENOENT);
        let mut pfd = libc::pollfd {
            fd: (*ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 30_000), 1, "async_fd readable");
        // Events until DEVICE_FATAL (the QP's own error event may come first).
        let mut fatal = false;
        for _ in 0..8 {
            let mut ev: ibv_async_event = std::mem::zeroed();
            assert_eq!(get_async(ctx, &mut ev), 0);
            ack_async(&mut ev);
            if ev.event_type == 8 {
                fatal = true;
                break;
            }
        }
        assert!(fatal, "IBV_EVENT_DEVICE_FATAL");
        assert!(alloc_pd(ctx).is_null());
        assert_eq!(errno(), libc::ENODEV);
        let mut n = -1;
        let list = get_list(&mut n);
        assert_eq!(n, 0, "the device left the list");
        free_list(list);
        assert!(open(dev).is_null());
        assert_eq!(errno(), libc::ENODEV);
        // Destroys and close still succeed.
        assert_eq!(destroy_qp(qp), 0);
        assert_eq!(dereg_mr(mr), 0);
        assert_eq!(destroy_cq(cq), 0);
        assert_eq!(dealloc_pd(pd), 0);
        assert_eq!(close(ctx), 0);
    }
}

/// rdma-core's `struct ibv_context_1_0` (libibverbs/compat-1_0.c): the
/// 27 operations (a 1.0 binary's inlines call `poll_cq` (7),
/// `req_notify_cq` (8), `post_send` (21) and `post_recv` (22)), then the
/// descriptors.
#[repr(C)]
struct Ctx10 {
    device: *mut c_void,
    ops: [*const c_void; 27],
    cmd_fd: c_int,
    async_fd: c_int,
    num_comp_vectors: c_int,
    real_context: *mut ibv_context,
}

/// The leading fields of `struct ibv_mr_1_0`.
#[repr(C)]
struct Mr10 {
    context: *mut Ctx10,
    pd: *mut c_void,
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// The leading fields of `struct ibv_cq_1_0`.
#[repr(C)]
struct Cq10 {
    context: *mut Ctx10,
    cq_context: *mut c_void,
    handle: u32,
    cqe: c_int,
}

/// The leading fields of `struct ibv_qp_1_0`.
#[repr(C)]
struct Qp10 {
    context: *mut Ctx10,
    qp_context: *mut c_void,
    pd: *mut c_void,
    send_cq: *mut Cq10,
    recv_cq: *mut Cq10,
    srq: *mut c_void,
    handle: u32,
    qp_num: u32,
    state: c_uint,
    qp_type: c_uint,
}

/// `struct ibv_qp_init_attr_1_0`.
#[repr(C)]
struct QpInit10 {
    qp_context: *mut c_void,
    send_cq: *mut Cq10,
    recv_cq: *mut Cq10,
    srq: *mut c_void,
    cap: ibv_qp_cap,
    qp_type: c_uint,
    sq_sig_all: c_int,
}

/// `struct ibv_send_wr_1_0` (`next` first; the `wr` union as words).
#[repr(C)]
struct SendWr10 {
    next: *mut SendWr10,
    wr_id: u64,
    sg_list: *mut ibv_sge,
    num_sge: c_int,
    opcode: c_uint,
    send_flags: c_int,
    imm_data: u32,
    wr: [u64; 4],
}

/// `struct ibv_recv_wr_1_0`.
#[repr(C)]
struct RecvWr10 {
    next: *mut RecvWr10,
    wr_id: u64,
    sg_list: *mut ibv_sge,
    num_sge: c_int,
}

type PollCq10 = unsafe extern "C" fn(*mut Cq10, c_int, *mut ibv_wc) -> c_int;
type PostSend10 = unsafe extern "C" fn(*mut Qp10, *mut SendWr10, *mut *mut SendWr10) -> c_int;
type PostRecv10 = unsafe extern "C" fn(*mut Qp10, *mut RecvWr10, *mut *mut RecvWr10) -> c_int;
type Notify10 = unsafe extern "C" fn(*mut Cq10, c_int) -> c_int;

/// The `IBVERBS_1.0` verbs through `dlvsym`: every one rdma-core exports
/// is there, next to (not instead of) the current default; a 1.0 program's
/// objects work end to end: device list, context, PD, MR, CQ with a
/// completion channel, RC QP connected to itself, posts through the 1.0
/// operation table (`bad_wr` names the 1.0 WR), completion events naming
/// the 1.0 CQ and its context, query of the QP naming the 1.0 CQs, and
/// every destroy.
///
/// # Safety
///
/// The library's device exists and is not removed meanwhile.
unsafe fn abi_1_0(lib: &Lib) {
    const V: &str = "IBVERBS_1.0";
    for name in [
        "ibv_ack_async_event",
        "ibv_ack_cq_events",
        "ibv_alloc_pd",
        "ibv_attach_mcast",
        "ibv_close_device",
        "ibv_create_ah",
        "ibv_create_cq",
        "ibv_create_qp",
        "ibv_create_srq",
        "ibv_dealloc_pd",
        "ibv_dereg_mr",
        "ibv_destroy_ah",
        "ibv_destroy_cq",
        "ibv_destroy_qp",
        "ibv_destroy_srq",
        "ibv_detach_mcast",
        "ibv_free_device_list",
        "ibv_get_async_event",
        "ibv_get_cq_event",
        "ibv_get_device_guid",
        "ibv_get_device_list",
        "ibv_get_device_name",
        "ibv_modify_qp",
        "ibv_modify_srq",
        "ibv_open_device",
        "ibv_query_device",
        "ibv_query_gid",
        "ibv_query_pkey",
        "ibv_query_port",
        "ibv_query_qp",
        "ibv_query_srq",
        "ibv_reg_mr",
        "ibv_resize_cq",
    ] {
        assert!(lib.has_version(name, V), "{name}@{V}");
        let (cur, old): (*mut c_void, *mut c_void) = (lib.sym(name), lib.vsym(name, V));
        assert_ne!(cur, old, "{name}: the default is the current verb, not the 1.0 one");
    }
    assert!(lib.has_version("ibv_register_driver", "IBVERBS_1.1"));

    let get_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void = lib.vsym("ibv_get_device_list", V);
    let free_list: unsafe extern "C" fn(*mut *mut c_void) = lib.vsym("ibv_free_device_list", V);
    let get_name: unsafe extern "C" fn(*mut c_void) -> *const c_char = lib.vsym("ibv_get_device_name", V);
    let open: unsafe extern "C" fn(*mut c_void) -> *mut Ctx10 = lib.vsym("ibv_open_device", V);
    let close: unsafe extern "C" fn(*mut Ctx10) -> c_int = lib.vsym("ibv_close_device", V);
    let query_port: unsafe extern "C" fn(*mut Ctx10, u8, *mut ibv_port_attr) -> c_int = lib.vsym("ibv_query_port", V);
    let query_gid: unsafe extern "C" fn(*mut Ctx10, u8, c_int, *mut ibv_gid) -> c_int = lib.vsym("ibv_query_gid", V);
    let alloc_pd: unsafe extern "C" fn(*mut Ctx10) -> *mut c_void = lib.vsym("ibv_alloc_pd", V);
    let dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int = lib.vsym("ibv_dealloc_pd", V);
    let reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut Mr10 = lib.vsym("ibv_reg_mr", V);
    let dereg_mr: unsafe extern "C" fn(*mut Mr10) -> c_int = lib.vsym("ibv_dereg_mr", V);
    let create_cq: unsafe extern "C" fn(*mut Ctx10, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut Cq10 =
        lib.vsym("ibv_create_cq", V);
    let destroy_cq: unsafe extern "C" fn(*mut Cq10) -> c_int = lib.vsym("ibv_destroy_cq", V);
    let get_cq_event: unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut Cq10, *mut *mut c_void) -> c_int =
        lib.vsym("ibv_get_cq_event", V);
    let ack_cq_events: unsafe extern "C" fn(*mut Cq10, c_uint) = lib.vsym("ibv_ack_cq_events", V);
    let create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInit10) -> *mut Qp10 = lib.vsym("ibv_create_qp", V);
    let modify_qp: unsafe extern "C" fn(*mut Qp10, *mut ibv_qp_attr, c_int) -> c_int = lib.vsym("ibv_modify_qp", V);
    let query_qp: unsafe extern "C" fn(*mut Qp10, *mut ibv_qp_attr, c_int, *mut QpInit10) -> c_int =
        lib.vsym("ibv_query_qp", V);
    let destroy_qp: unsafe extern "C" fn(*mut Qp10) -> c_int = lib.vsym("ibv_destroy_qp", V);
    let create_ch: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel = lib.sym("ibv_create_comp_channel");
    let destroy_ch: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int = lib.sym("ibv_destroy_comp_channel");

    // SAFETY: the 1.0 C API used as a 1.0 binary does.
    unsafe {
        let mut n = 0;
        let list = get_list(&mut n);
        assert!(!list.is_null());
        assert_eq!(n, 1);
        assert!((*list.add(1)).is_null(), "NULL-terminated");
        let dev = *list;
        assert_eq!(s(get_name(dev)), "softverbs_0");
        let ctx = open(dev);
        assert!(!ctx.is_null());
        let real = (*ctx).real_context;
        assert_eq!((*ctx).async_fd, (*real).async_fd);
        assert!((*ctx).num_comp_vectors >= 1);
        let mut port: ibv_port_attr = std::mem::zeroed();
        assert_eq!(query_port(ctx, 1, &mut port), 0);
        assert_eq!(port.state, 4, "PORT_ACTIVE");
        let mut gid = ibv_gid::default();
        assert_eq!(query_gid(ctx, 1, 0, &mut gid), 0);

        let pd = alloc_pd(ctx);
        assert!(!pd.is_null());
        let mut buf = vec![0u8; 4096];
        let mr = reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), 1 | 2 | 4);
        assert!(!mr.is_null());
        assert_eq!((*mr).context, ctx);
        let ch = create_ch(real);
        assert!(!ch.is_null());
        let tag = 0x5eed as *mut c_void;
        let cq = create_cq(ctx, 16, tag, ch, 0);
        assert!(!cq.is_null());
        assert_eq!(((*cq).context, (*cq).cq_context, (*cq).cqe), (ctx, tag, 16));
        let qtag = 0x9a as *mut c_void;
        let mut init = QpInit10 {
            qp_context: qtag,
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: 2,
            sq_sig_all: 0,
        };
        let qp = create_qp(pd, &mut init);
        assert!(!qp.is_null());
        assert!((*qp).qp_num != 0);
        assert_eq!(
            ((*qp).context, (*qp).qp_context, (*qp).send_cq, (*qp).qp_type),
            (ctx, qtag, cq, 2)
        );
        assert!(init.cap.max_send_wr >= 8, "the capacities granted");

        // INIT, RTR towards itself, RTS.
        let mut a = ibv_qp_attr {
            qp_state: 1,
            port_num: 1,
            qp_access_flags: 1 | 2 | 4,
            ..Default::default()
        };
        assert_eq!(modify_qp(qp, &mut a, 1 | 16 | 32 | 8), 0);
        let mut a = ibv_qp_attr {
            qp_state: 2,
            path_mtu: 3,
            dest_qp_num: (*qp).qp_num,
            rq_psn: 7,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                is_global: 1,
                grh: ibv_global_route {
                    dgid: gid,
                    hop_limit: 64,
                    ..Default::default()
                },
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            modify_qp(qp, &mut a, 1 | 128 | 256 | 1 << 20 | 1 << 12 | 1 << 17 | 1 << 15),
            0
        );
        let mut a = ibv_qp_attr {
            qp_state: 3,
            sq_psn: 7,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        assert_eq!(
            modify_qp(qp, &mut a, 1 | 1 << 16 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13),
            0
        );
        let mut qa = ibv_qp_attr::default();
        let mut qi: QpInit10 = std::mem::zeroed();
        assert_eq!(query_qp(qp, &mut qa, 1, &mut qi), 0);
        assert_eq!(qa.qp_state, 3);
        assert_eq!(
            (qi.qp_context, qi.send_cq, qi.recv_cq, qi.srq),
            (qtag, cq, cq, null_mut())
        );

        // The data path through the 1.0 operation table.
        let poll: PollCq10 = std::mem::transmute((*ctx).ops[7]);
        let notify: Notify10 = std::mem::transmute((*ctx).ops[8]);
        let post_send: PostSend10 = std::mem::transmute((*ctx).ops[21]);
        let post_recv: PostRecv10 = std::mem::transmute((*ctx).ops[22]);
        let mut rsge = ibv_sge {
            addr: buf.as_ptr() as u64 + 2048,
            length: 64,
            lkey: (*mr).lkey,
        };
        let mut rwr = RecvWr10 {
            next: null_mut(),
            wr_id: 7,
            sg_list: &mut rsge,
            num_sge: 1,
        };
        let mut rbad = null_mut();
        assert_eq!(post_recv(qp, &mut rwr, &mut rbad), 0);
        assert_eq!(notify(cq, 0), 0);
        buf[..5].copy_from_slice(b"hello");
        let mut ssge = ibv_sge {
            addr: buf.as_ptr() as u64,
            length: 5,
            lkey: (*mr).lkey,
        };
        let mut second = SendWr10 {
            next: null_mut(),
            wr_id: 9,
            sg_list: &mut ssge,
            num_sge: 2, // over max_send_sge: refused
            opcode: 2,  // SEND
            send_flags: 2,
            imm_data: 0,
            wr: [0; 4],
        };
        let mut first = SendWr10 {
            next: &mut second,
            wr_id: 8,
            sg_list: &mut ssge,
            num_sge: 1,
            opcode: 2,
            send_flags: 2, // SIGNALED
            imm_data: 0,
            wr: [0; 4],
        };
        let mut bad = null_mut();
        assert_eq!(post_send(qp, &mut first, &mut bad), libc::EINVAL);
        assert_eq!(bad, &mut second as *mut SendWr10, "bad_wr names the 1.0 WR");

        // The completion event names the 1.0 CQ and its context.
        let (chp, gce) = (ch as usize, get_cq_event as usize);
        let (evcq, evctx) = within("ibv_get_cq_event@IBVERBS_1.0", move || {
            // The library's 1.0 verb, a live channel.
            let get_cq_event: unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut Cq10, *mut *mut c_void) -> c_int =
                std::mem::transmute(gce);
            let (mut c, mut x) = (null_mut(), null_mut());
            assert_eq!(get_cq_event(chp as *mut ibv_comp_channel, &mut c, &mut x), 0);
            (c as usize, x as usize)
        });
        assert_eq!((evcq, evctx), (cq as usize, tag as usize));
        ack_cq_events(cq, 1);
        let mut wc = [ibv_wc::default(); 4];
        let mut got = Vec::new();
        let start = std::time::Instant::now();
        while got.len() < 2 && start.elapsed() < std::time::Duration::from_secs(30) {
            let k = poll(cq, 4, wc.as_mut_ptr());
            assert!(k >= 0);
            got.extend(wc[..k as usize].iter().map(|w| (w.wr_id, w.status, w.byte_len)));
        }
        got.sort();
        assert_eq!(got, vec![(7, 0, 5), (8, 0, 5)]);
        assert_eq!(&buf[2048..2053], b"hello");

        assert_eq!(destroy_qp(qp), 0);
        assert_eq!(destroy_cq(cq), 0);
        assert_eq!(destroy_ch(ch), 0);
        assert_eq!(dereg_mr(mr), 0);
        assert_eq!(dealloc_pd(pd), 0);
        assert_eq!(close(ctx), 0);
        free_list(list);
    }
}
