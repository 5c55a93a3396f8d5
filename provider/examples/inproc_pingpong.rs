//! RC ping-pong of 8-byte sends between the two embedded soft devices in
//! one process, one thread (inline progress): every WR must complete
//! exactly once. `cargo run --release -p softverbs --example inproc_pingpong -- 1000000`

use std::time::Instant;

use softverbs::verbs::*;

#[allow(dead_code)] // the test includes this file and calls `run`
fn main() -> Result<()> {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    run(iters)
}

/// Runs `iters` round trips and checks exactly-once completion.
pub(crate) fn run(iters: u64) -> Result<()> {
    let devs = softverbs::soft::embedded_default()?;
    let (ca, cb) = (devs[0].open()?, devs[1].open()?);
    let (a, b) = (Ends::new(&ca)?, Ends::new(&cb)?);
    let (ea, eb) = (Endpoint::local(&ca, &a.qp, 1, 0)?, Endpoint::local(&cb, &b.qp, 1, 0)?);
    a.qp.connect(&ca, &ea, &eb)?;
    b.qp.connect(&cb, &eb, &ea)?;
    let start = Instant::now();
    let (sends, recvs) = pingpong(&a, &b, iters)?;
    let dt = start.elapsed();
    println!(
        "{iters} round trips of 8-byte RC sends: {:.3} s, {:.3} us half round trip, {sends} send and {recvs} receive completions",
        dt.as_secs_f64(),
        dt.as_secs_f64() * 1e6 / iters as f64 / 2.0
    );
    assert_eq!(
        (sends, recvs),
        (2 * iters, 2 * iters),
        "every WR completes exactly once"
    );
    Ok(())
}

/// One side: PD, CQ, QP, an MR.
struct Ends {
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

impl Ends {
    fn new(ctx: &Context) -> Result<Ends> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.cq_builder(256).create()?;
        let cap = QpCap {
            max_inline_data: 64,
            ..QpInitAttr::DEFAULT_CAP
        };
        let qp = pd.create_qp(
            &QpInitAttr::new(QpType::Rc, &cq, &cq)
                .with_cap(cap)
                .with_sq_sig_all(true),
        )?;
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
        Ok(Ends { _pd: pd, cq, qp, mr })
    }

    fn post_recv(&self) -> Result<()> {
        let sge = [self.mr.sge(0, 64)?];
        Ok(self.qp.post_recv(&[RecvWr::new(0, &sge)])?)
    }

    fn send(&self) -> Result<()> {
        let sge = [self.mr.sge(64, 8)?];
        Ok(self.qp.post_send(&[SendWr::new(1, SendOp::Send, &sge)])?)
    }

    /// Polls until a completion of `opcode` arrives; counts every one seen.
    fn wait(&self, opcode: WcOpcode, sends: &mut u64, recvs: &mut u64) -> Result<()> {
        let mut wc = [WorkCompletion::default(); 4];
        loop {
            let n = self.cq.poll(&mut wc)?;
            let mut hit = false;
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if w.opcode == WcOpcode::Recv {
                    *recvs += 1;
                } else {
                    *sends += 1;
                }
                hit |= w.opcode == opcode;
            }
            if hit {
                return Ok(());
            }
        }
    }
}

fn pingpong(a: &Ends, b: &Ends, iters: u64) -> Result<(u64, u64)> {
    let (mut sends, mut recvs) = (0, 0);
    a.post_recv()?;
    b.post_recv()?;
    for _ in 0..iters {
        a.send()?;
        b.wait(WcOpcode::Recv, &mut sends, &mut recvs)?;
        b.post_recv()?;
        b.send()?;
        a.wait(WcOpcode::Recv, &mut sends, &mut recvs)?;
        a.post_recv()?;
    }
    // The last sends' completions.
    let mut wc = [WorkCompletion::default(); 16];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sends < 2 * iters && std::time::Instant::now() < until {
        for cq in [&a.cq, &b.cq] {
            let n = cq.poll(&mut wc)?;
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success);
                if w.opcode == WcOpcode::Recv {
                    recvs += 1;
                } else {
                    sends += 1;
                }
            }
        }
    }
    Ok((sends, recvs))
}
