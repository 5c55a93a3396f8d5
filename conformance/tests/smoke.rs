//! Smoke test: the RC data path between the two embedded soft devices.

use std::time::Duration;

use softverbs::verbs::*;
use softverbs_conformance::harness::*;

fn ctxs() -> (Context, Context) {
    let devs = softverbs::soft::embedded_default().unwrap();
    (devs[0].open().unwrap(), devs[1].open().unwrap())
}

const T: Duration = Duration::from_secs(5);

#[test]
fn rc_send_write_read_atomics() {
    let (ca, cb) = ctxs();
    let p = Pair::new(&ca, &cb, PairConfig::default()).unwrap();
    // send
    p.b.post_recv(7, 0, 4096).unwrap();
    p.a.mr.write(0, b"hello world").unwrap();
    let sge = [p.a.mr.sge(0, 11).unwrap()];
    p.a.qp
        .post_send(&[SendWr::new(1, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = p.a.wait_send(T).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let wc = p.b.wait_recv(T).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (7, WcStatus::Success, 11));
    assert_eq!(p.b.mr.to_vec(0, 11).unwrap(), b"hello world");
    // write, multi-packet
    let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    p.a.mr.write(100, &data).unwrap();
    let sge = [p.a.mr.sge(100, 5000).unwrap()];
    p.a.qp
        .post_send(&[SendWr::new(
            2,
            SendOp::Write {
                remote: p.b.mr.remote(8192),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = p.a.wait_send(T).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(p.b.mr.to_vec(8192, 5000).unwrap(), data);
    // read back
    let sge = [p.a.mr.sge(20000, 5000).unwrap()];
    p.a.qp
        .post_send(&[SendWr::new(
            3,
            SendOp::Read {
                remote: p.b.mr.remote(8192),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = p.a.wait_send(T).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (3, WcStatus::Success, WcOpcode::RdmaRead, 5000)
    );
    assert_eq!(p.a.mr.to_vec(20000, 5000).unwrap(), data);
    // atomics
    p.b.mr.store_u64(64, 10).unwrap();
    let sge = [p.a.mr.sge(40000, 8).unwrap()];
    p.a.qp
        .post_send(&[SendWr::new(
            4,
            SendOp::FetchAdd {
                remote: p.b.mr.remote(64),
                add: 5,
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = p.a.wait_send(T).unwrap();
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(p.a.mr.load_u64(40000).unwrap(), 10);
    assert_eq!(p.b.mr.load_u64(64).unwrap(), 15);
    p.a.qp
        .post_send(&[SendWr::new(
            5,
            SendOp::CompareSwap {
                remote: p.b.mr.remote(64),
                compare: 15,
                swap: 99,
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED)])
        .unwrap();
    let wc = p.a.wait_send(T).unwrap();
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::CompSwap));
    assert_eq!(p.a.mr.load_u64(40000).unwrap(), 15);
    assert_eq!(p.b.mr.load_u64(64).unwrap(), 99);
}
