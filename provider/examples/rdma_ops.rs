//! RDMA WRITE, READ, SEND with immediate data and an atomic fetch-and-add
//! between two soft devices of this process, event-driven (each side waits
//! on a completion channel). Also the crate's front-page example.
//!
//! Run: `cargo run -p softverbs --example rdma_ops`.

use std::time::Duration;

use softverbs::verbs::{
    AccessFlags, CompChannel, Context, Cq, Endpoint, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus,
    WorkCompletion,
};

/// Waits on `channel` for `cq`'s next completion: arm, poll, sleep, repeat.
fn next_completion(channel: &CompChannel, cq: &Cq) -> Result<WorkCompletion, Box<dyn std::error::Error>> {
    let mut wc = [WorkCompletion::default()];
    loop {
        cq.req_notify(false)?;
        // Poll after arming: a completion that arrived before the arm
        // raised no event.
        if cq.poll(&mut wc)? == 1 {
            return Ok(wc[0]);
        }
        if channel.get_cq_event(Some(Duration::from_secs(10)))?.is_none() {
            return Err("no completion within 10 s".into());
        }
        cq.ack_events(1);
    }
}

/// One side: a context, a CQ on a completion channel, an RC QP, and a
/// 4 KiB buffer peers may read, write and update atomically.
struct Side {
    ctx: Context,
    channel: CompChannel,
    cq: Cq,
    qp: softverbs::verbs::Qp,
    mr: softverbs::verbs::Mr,
    _pd: softverbs::verbs::Pd,
}

fn side(ctx: Context) -> Result<Side, Box<dyn std::error::Error>> {
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.cq_builder(64).channel(&channel).create()?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE)?;
    Ok(Side {
        ctx,
        channel,
        cq,
        qp,
        mr,
        _pd: pd,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two soft devices joined in this process (no device exists before).
    let devs = softverbs::soft::embedded_default()?;
    let a = side(devs[0].open()?)?;
    let b = side(devs[1].open()?)?;

    // What each side would send the other (`Endpoint::encode`, or
    // `softverbs::verbs::exchange` over TCP), then RESET -> RTS.
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0)?.with_buffer(&a.mr);
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0)?.with_buffer(&b.mr);
    a.qp.connect(&a.ctx, &ea, &eb)?;
    b.qp.connect(&b.ctx, &eb, &ea)?;
    let remote = eb.buffer.ok_or("B announced no buffer")?;

    // RDMA WRITE: A's bytes 0..5 to B's offset 100.
    a.mr.write(0, b"hello")?;
    let sge = [a.mr.sge(0, 5)?];
    let write = SendOp::Write { remote: remote.at(100) };
    a.qp.post_send(&[SendWr::new(1, write, &sge).flags(SendFlags::SIGNALED)])?;
    let wc = next_completion(&a.channel, &a.cq)?;
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    assert_eq!(b.mr.to_vec(100, 5)?, b"hello");

    // RDMA READ: B's offset 100 back into A's offset 200.
    let sge = [a.mr.sge(200, 5)?];
    let read = SendOp::Read { remote: remote.at(100) };
    a.qp.post_send(&[SendWr::new(2, read, &sge).flags(SendFlags::SIGNALED)])?;
    let wc = next_completion(&a.channel, &a.cq)?;
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::Success, 5));
    assert_eq!(a.mr.to_vec(200, 5)?, b"hello");

    // SEND with immediate data into a receive B posted.
    let rsge = [b.mr.sge(1024, 64)?];
    b.qp.post_recv(&[RecvWr::new(3, &rsge)])?;
    a.mr.write(300, b"ping")?;
    let sge = [a.mr.sge(300, 4)?];
    let send = SendOp::SendWithImm { imm: 0xfeed };
    a.qp.post_send(&[SendWr::new(4, send, &sge).flags(SendFlags::SIGNALED)])?;
    let got = next_completion(&b.channel, &b.cq)?;
    assert_eq!(
        (got.wr_id, got.status, got.byte_len, got.imm()),
        (3, WcStatus::Success, 4, Some(0xfeed))
    );
    assert_eq!(b.mr.to_vec(1024, 4)?, b"ping");
    let wc = next_completion(&a.channel, &a.cq)?;
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));

    // Atomic fetch-and-add on B's word at offset 2048; the old value lands
    // in A's offset 400.
    b.mr.store_u64(2048, 40)?;
    let sge = [a.mr.sge(400, 8)?];
    let faa = SendOp::FetchAdd {
        remote: remote.at(2048),
        add: 2,
    };
    a.qp.post_send(&[SendWr::new(5, faa, &sge).flags(SendFlags::SIGNALED)])?;
    let wc = next_completion(&a.channel, &a.cq)?;
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    assert_eq!(b.mr.load_u64(2048)?, 42);
    // The original value.
    assert_eq!(a.mr.load_u64(400)?, 40);

    println!("WRITE, READ, SEND with immediate and FETCH_ADD all completed");
    Ok(())
}
