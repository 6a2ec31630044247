//! Shared receive queues, sans-IO: receive WQEs that any number of QPs take from.
//!
//! An [`Srq`] is a queue of posted receive WQEs with a capacity (`max_wr`), a scatter/gather
//! limit (`max_sge`) and a limit (the "low watermark" of `ibv_modify_srq`). A QP created to use
//! one ([`RcQp::with_srq`](super::RcQp::with_srq), [`UcQp::with_srq`](super::UcQp::with_srq),
//! [`UdQp::with_srq`](super::ud::UdQp::with_srq)) has no receive queue of its own: the driver
//! lends it the SRQ with each packet it feeds
//! ([`RcQp::handle_packet_srq`](super::RcQp::handle_packet_srq),
//! [`UcQp::handle_packet_srq`](super::UcQp::handle_packet_srq),
//! [`UdQp::handle_packet_srq`](super::ud::UdQp::handle_packet_srq)), as it lends the memory.
//!
//! As in rdma_rxe (`get_srq_wqe` in `rxe_resp.c`), a message that needs a receive WQE takes the
//! one at the head of the SRQ when it starts (its first packet; the last one of an RDMA WRITE
//! with immediate) and the QP keeps it until the message completes, so several QPs' messages can
//! be in progress at once, each into its own WQE. When a WQE is taken and fewer than `limit`
//! remain, the limit is disarmed (set to 0) and [`Srq::take_limit_event`] reports it once: the
//! driver raises `IBV_EVENT_SRQ_LIMIT_REACHED`.

use std::collections::VecDeque;

use super::rc::PostError;
use super::types::RecvWqe;

/// Why [`Srq::modify`] refused (the verbs return `EINVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SrqError {
    #[error("max_wr must be at least 1")]
    ZeroMaxWr,
    #[error("max_wr {max_wr} is below the {posted} WQEs posted")]
    BelowPosted { max_wr: u32, posted: u32 },
    #[error("srq_limit {limit} is above max_wr {max_wr}")]
    LimitAboveMaxWr { limit: u32, max_wr: u32 },
}

/// One shared receive queue's state.
#[derive(Debug, Default)]
pub struct Srq {
    rq: VecDeque<RecvWqe>,
    max_wr: u32,
    max_sge: u32,
    /// Armed when non-zero: the event fires when a take leaves fewer WQEs than this.
    limit: u32,
    /// The limit fired and the driver has not collected the event yet.
    limit_reached: bool,
}

impl Srq {
    /// An empty SRQ of `max_wr` WQEs (at least 1) of up to `max_sge` SGEs each, with its limit
    /// armed at `limit` if non-zero (rxe takes the limit given at creation).
    pub fn new(max_wr: u32, max_sge: u32, limit: u32) -> Result<Srq, SrqError> {
        if max_wr == 0 {
            return Err(SrqError::ZeroMaxWr);
        }
        if limit > max_wr {
            return Err(SrqError::LimitAboveMaxWr { limit, max_wr });
        }
        Ok(Srq {
            rq: VecDeque::new(),
            max_wr,
            max_sge,
            limit,
            limit_reached: false,
        })
    }

    /// `ibv_post_srq_recv` of one WQE.
    pub fn post_recv(&mut self, wqe: RecvWqe) -> Result<(), PostError> {
        if wqe.sg_list.len() > self.max_sge as usize {
            return Err(PostError::TooManySge {
                got: wqe.sg_list.len(),
                max: self.max_sge,
            });
        }
        if self.rq.len() >= self.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        self.rq.push_back(wqe);
        Ok(())
    }

    /// Take the WQE at the head for a message that starts (the responder calls this). Taking
    /// one that leaves fewer than an armed limit disarms it and records the event.
    pub fn take(&mut self) -> Option<RecvWqe> {
        let w = self.rq.pop_front()?;
        if self.limit > 0 && (self.rq.len() as u64) < self.limit as u64 {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(w)
    }

    /// True once after a take fired the limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    /// `ibv_modify_srq`: `max_wr` resizes the queue (never below the WQEs posted, nor below the
    /// limit); `limit` arms the limit event (0 disarms it). Nothing changes on an error.
    pub fn modify(&mut self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), SrqError> {
        let new_max = max_wr.unwrap_or(self.max_wr);
        let new_limit = limit.unwrap_or(self.limit);
        if new_max == 0 {
            return Err(SrqError::ZeroMaxWr);
        }
        if (new_max as usize) < self.rq.len() {
            return Err(SrqError::BelowPosted {
                max_wr: new_max,
                posted: self.rq.len() as u32,
            });
        }
        if new_limit > new_max {
            return Err(SrqError::LimitAboveMaxWr {
                limit: new_limit,
                max_wr: new_max,
            });
        }
        self.max_wr = new_max;
        self.limit = new_limit;
        Ok(())
    }

    /// WQEs posted and not yet taken.
    pub fn len(&self) -> usize {
        self.rq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }

    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The armed limit; 0 when not armed.
    pub fn limit(&self) -> u32 {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::types::Sge;

    fn wqe(id: u64, nsge: usize) -> RecvWqe {
        RecvWqe {
            wr_id: id,
            sg_list: vec![Sge::default(); nsge].into(),
        }
    }

    #[test]
    fn capacity_and_sge_limit() {
        let mut s = Srq::new(2, 1, 0).unwrap();
        assert_eq!(
            s.post_recv(wqe(1, 2)),
            Err(PostError::TooManySge { got: 2, max: 1 })
        );
        s.post_recv(wqe(1, 1)).unwrap();
        s.post_recv(wqe(2, 0)).unwrap();
        assert_eq!(s.post_recv(wqe(3, 1)), Err(PostError::QueueFull));
        assert_eq!(s.take().map(|w| w.wr_id), Some(1));
        s.post_recv(wqe(3, 1)).unwrap();
        assert_eq!(s.take().map(|w| w.wr_id), Some(2));
        assert_eq!(s.take().map(|w| w.wr_id), Some(3));
        assert_eq!(s.take(), None);
        assert_eq!(Srq::new(0, 1, 0).unwrap_err(), SrqError::ZeroMaxWr);
    }

    #[test]
    fn limit_fires_once_below_it_and_disarms() {
        let mut s = Srq::new(8, 1, 0).unwrap();
        for i in 0..5 {
            s.post_recv(wqe(i, 1)).unwrap();
        }
        s.modify(None, Some(3)).unwrap();
        assert_eq!(s.limit(), 3);
        s.take().unwrap(); // 4 left
        s.take().unwrap(); // 3 left: not below
        assert!(!s.take_limit_event());
        s.take().unwrap(); // 2 left: below 3
        assert!(s.take_limit_event());
        assert!(!s.take_limit_event(), "reported once");
        assert_eq!(s.limit(), 0, "disarmed");
        s.take().unwrap();
        assert!(!s.take_limit_event());
        // Re-armed: fires again on the next take below it.
        s.modify(None, Some(4)).unwrap();
        assert!(!s.take_limit_event(), "arming alone does not fire (as rxe)");
        s.take().unwrap();
        assert!(s.take_limit_event());
        // An empty SRQ takes nothing and fires nothing.
        s.modify(None, Some(1)).unwrap();
        assert_eq!(s.take(), None);
        assert!(!s.take_limit_event());
    }

    #[test]
    fn modify_resizes_within_bounds() {
        let mut s = Srq::new(4, 1, 0).unwrap();
        for i in 0..3 {
            s.post_recv(wqe(i, 1)).unwrap();
        }
        assert_eq!(
            s.modify(Some(2), None),
            Err(SrqError::BelowPosted {
                max_wr: 2,
                posted: 3
            })
        );
        assert_eq!(s.modify(Some(0), None), Err(SrqError::ZeroMaxWr));
        assert_eq!(
            s.modify(None, Some(5)),
            Err(SrqError::LimitAboveMaxWr {
                limit: 5,
                max_wr: 4
            })
        );
        assert_eq!(s.max_wr(), 4, "unchanged after errors");
        s.modify(Some(16), Some(5)).unwrap();
        assert_eq!((s.max_wr(), s.limit()), (16, 5));
        assert_eq!(
            s.modify(Some(4), None),
            Err(SrqError::LimitAboveMaxWr {
                limit: 5,
                max_wr: 4
            })
        );
        s.modify(Some(3), Some(0)).unwrap();
        assert_eq!((s.max_wr(), s.limit()), (3, 0));
        assert_eq!(s.post_recv(wqe(9, 1)), Err(PostError::QueueFull));
    }
}
