//! Async events: `ibv_get_async_event` (waits on `context->async_fd` unless the program made
//! it non-blocking) and `ibv_ack_async_event`.

use softrdma::verbs::AsyncEvent;

use super::context::Ctx;
use crate::abi::*;
use crate::handle::{guard, set_errno};

fn fd_nonblocking(fd: i32) -> bool {
    // SAFETY: fcntl on a descriptor; an invalid one just fails.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> i32 {
    guard(-1, || {
        // SAFETY: checked handle; the caller's struct or NULL.
        let (Some(ctx), Some(out)) = (unsafe { Ctx::from_ibv(context) }, unsafe { event.as_mut() })
        else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let fd = ctx.rust.async_fd();
        loop {
            if let Some(e) = ctx.rust.poll_async_event() {
                // SAFETY: ibv_async_event is plain C data; all-zero is valid.
                *out = unsafe { std::mem::zeroed() };
                match e {
                    AsyncEvent::CqErr { cq } => {
                        let p = ctx.cqs.get(cq);
                        let Some(p) = p else { continue };
                        out.element.cq = p as *mut ibv_cq;
                        out.event_type = IBV_EVENT_CQ_ERR;
                    }
                    AsyncEvent::QpFatal { qp_num } | AsyncEvent::QpLastWqeReached { qp_num } => {
                        let p = ctx.qps.get(qp_num);
                        let Some(p) = p else { continue };
                        out.element.qp = p as *mut ibv_qp;
                        out.event_type = match e {
                            AsyncEvent::QpFatal { .. } => IBV_EVENT_QP_FATAL,
                            _ => IBV_EVENT_QP_LAST_WQE_REACHED,
                        };
                    }
                    AsyncEvent::SrqLimitReached { srq } => {
                        let p = ctx.srqs.get(srq);
                        let Some(p) = p else { continue };
                        out.element.srq = p as *mut ibv_srq;
                        out.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
                    }
                    // An event this build does not know how to say in C: skip it.
                    _ => continue,
                }
                return 0;
            }
            if fd < 0 || fd_nonblocking(fd) {
                set_errno(libc::EAGAIN);
                return -1;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return -1;
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {
    // Events are copies; destroying an object does not wait for their acknowledgement.
}

versioned!(
    ibv_get_async_event @ "IBVERBS_1.1",
    ibv_ack_async_event @ "IBVERBS_1.1",
);
