//! The READ-credit backlog: requests that wait for READ/atomic credits
//! (or behind one that does) go out as earlier ones retire, and the
//! LOCAL_INVs of lazily invalidated requests are posted after them.

use super::retire::flush_wc;
use super::*;

impl Track {
    /// Posts the LOCAL_INVs of lazily invalidated requests (signaled, no
    /// callback: their MRs go back to the pool when they retire). On a
    /// failed or closing QP the MRs, which may still be valid, are
    /// discarded instead.
    #[inline(never)]
    pub(super) fn post_followups(&mut self, sh: &QpShared, sec: &mut dyn DeviceSection, out: &mut Vec<Done>) {
        for f in std::mem::take(&mut self.followups) {
            let Followup { key, mut req } = f;
            if self.sq.err || self.closing {
                self.sq_used -= 1;
                req.poison();
                out.push(Done::release(req));
                continue;
            }
            // A single WR is posted whole or not at all: on an error the
            // request comes back.
            if let Err((_, Some(mut req))) = self.post_now(sh, sec, req, UlpWr::local_inv(key).into()) {
                req.poison();
                out.push(Done::release(req));
            }
        }
    }

    /// Posts queued requests while READ/atomic credits allow; on a failed
    /// queue (or a closing QP) completes them with a flush instead.
    #[inline(never)]
    pub(super) fn pump(&mut self, sh: &QpShared, sec: &mut dyn DeviceSection, out: &mut Vec<Done>) {
        while let Some(q) = self.backlog.front() {
            let dead = self.sq.err || self.closing;
            if !dead && q.rd > 0 && self.rd_out > 0 && self.rd_out + q.rd > sh.rd_limit() {
                break;
            }
            let q = self.backlog.pop_front().expect("front exists");
            if dead {
                self.flush_queued(sh, q, 0, out);
                continue;
            }
            if let Err((e, unposted)) = self.post_now(sh, sec, q.req, q.chain) {
                // The request completes once with a flush carrying the
                // errno (after its posted prefix, if any, retires).
                let wc = flush_wc(sh.epoch | self.sq.next, sh.qpn, e.errno() as u32);
                match unposted {
                    Some(mut req) => {
                        req.rare().first_err.get_or_insert(wc);
                        self.stats.synthesized += 1;
                        self.finish(req, &wc, out);
                    }
                    None => {
                        if let Some(req) = self.last_posted() {
                            req.rare().first_err.get_or_insert(wc);
                        }
                    }
                }
            }
        }
    }

    pub(super) fn flush_queued(&mut self, sh: &QpShared, q: Queued, vendor_err: u32, out: &mut Vec<Done>) {
        let Queued { mut req, chain, .. } = q;
        self.sq_used -= chain.len() as u32;
        self.stats.synthesized += 1;
        let wc = flush_wc(sh.epoch | self.sq.next, sh.qpn, vendor_err);
        req.keep(chain);
        self.finish(req, &wc, out);
    }
}
