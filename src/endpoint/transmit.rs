//! The send side of the endpoint: what its QPs and its CM have to send is built into the
//! buffers of a [`TxSink`] (BTH to ICRC), with the route each packet takes; completions go to
//! the CQs, transport errors become async events.

use std::time::Instant;

use super::events::{AsyncEvent, AsyncQueue};
use super::gids::{GidTable, Route};
use super::memory::MrTable;
use super::qp::QpTransport;
use super::Endpoint;
use crate::transport::{CqSide, QpAttr, QpState};

/// Where the endpoint's packets go: the driver's batch for the sockets, or a simulated link.
pub(crate) trait TxSink {
    /// The buffer to build the next packet in (BTH to ICRC; the ICRC is the sink's to fill).
    fn buf(&mut self) -> &mut [u8];
    /// Send the `len` bytes built in [`TxSink::buf`] along `route`; no route (no peer, or no
    /// address of its family): dropped.
    fn commit(&mut self, len: usize, route: Option<Route>);
}

impl Endpoint {
    /// Build everything QP `qpn` has to send into `out`, and move its completions to the CQs.
    pub fn transmit_qp<S: TxSink>(
        &mut self,
        qpn: u32,
        gids: &GidTable,
        mrs: &MrTable,
        now: Instant,
        out: &mut S,
    ) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        let mem = mrs.for_pd(slot.pd);
        match &mut slot.qp {
            QpTransport::Rc(rc) => {
                // The route is looked up once, and only if there is something to send (a
                // post_recv or a receive that only completes sends nothing).
                let mut dst = None;
                while let Some(len) = rc.poll_transmit(now, &mem, out.buf()) {
                    let d =
                        *dst.get_or_insert_with(|| rc.destination().and_then(|av| gids.route(&av)));
                    out.commit(len, d);
                }
                while let Some(c) = rc.poll_completion() {
                    match c.side {
                        CqSide::Send => slot.send_cq.push(c),
                        CqSide::Recv => slot.recv_cq.push(c),
                    }
                }
            }
            QpTransport::Uc(uc) => {
                let mut dst = None;
                while let Some(len) = uc.poll_transmit(&mem, out.buf()) {
                    let d =
                        *dst.get_or_insert_with(|| uc.destination().and_then(|av| gids.route(&av)));
                    out.commit(len, d);
                }
                while let Some(c) = uc.poll_completion() {
                    match c.side {
                        CqSide::Send => slot.send_cq.push(c),
                        CqSide::Recv => slot.recv_cq.push(c),
                    }
                }
            }
            QpTransport::Ud(ud) => {
                // Each UD packet goes to the address of its own work request's AH.
                while let Some(t) = ud.poll_transmit(&mem, out.buf()) {
                    out.commit(t.len, gids.route(&t.av));
                }
                while let Some(c) = ud.poll_completion() {
                    match c.wc.side {
                        CqSide::Send => slot.send_cq.push(c.wc),
                        CqSide::Recv => slot.recv_cq.push(c.wc),
                    }
                }
            }
        }
        // Whether its timers must be looked at (see `Endpoint::handle_qp_timeouts`).
        if slot.qp.poll_timeout().is_some() {
            self.timed.insert(qpn);
        } else {
            self.timed.remove(&qpn);
        }
    }

    /// Transmit for every QP that received, timed out or changed state; report a QP the
    /// transport moved to ERR as `IBV_EVENT_QP_FATAL`.
    pub fn transmit_dirty<S: TxSink>(
        &mut self,
        gids: &GidTable,
        mrs: &MrTable,
        events: &AsyncQueue,
        now: Instant,
        out: &mut S,
    ) {
        let mut dirty = std::mem::take(&mut self.dirty);
        for &qpn in &dirty {
            self.transmit_qp(qpn, gids, mrs, now, out);
            if let Some(slot) = self.qps.get_mut(&qpn) {
                let st = slot.qp.state();
                if st == QpState::Err && slot.last_state != QpState::Err {
                    events.push(AsyncEvent::QpFatal { qp_num: qpn });
                }
                slot.last_state = st;
                slot.check_last_wqe(qpn, events);
            }
        }
        dirty.clear();
        self.dirty = dirty;
    }

    /// Let the CM's user take its events (moving QPs as they say), and build the CM's MADs
    /// into `out`.
    pub fn transmit_gsi<S: TxSink>(&mut self, gids: &GidTable, now: Instant, out: &mut S) {
        self.gsi_pending = false;
        {
            let Endpoint {
                gsi, qps, dirty, ..
            } = self;
            let mut modify = |qpn: u32, a: &QpAttr| super::modify_qp(qps, dirty, qpn, a, now);
            gsi.process(now, &mut modify);
        }
        while let Some(g) = self.gsi.endpoint_mut().poll_transmit() {
            let Some(buf) = out.buf().get_mut(..g.packet.len()) else {
                continue;
            };
            buf.copy_from_slice(&g.packet);
            // From the address the peer talks to, else the first of its family.
            let sgid = g.from.and_then(|f| gids.index_of(&f)).unwrap_or(0);
            out.commit(g.packet.len(), gids.route_gid(&g.to, sgid as u8));
        }
    }
}
