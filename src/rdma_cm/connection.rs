//! One-call rdma_cm connections, the seeds' flow in a call each: [`Connection::connect`]
//! (resolve the address and the route, make a PD, a CQ and an RC QP, connect with private data,
//! wait for ESTABLISHED) and [`Listener::accept`] (wait for a request, make the same objects,
//! accept with private data, wait for ESTABLISHED). The objects are the ordinary ones: post on
//! [`Connection::qp`], poll [`Connection::cq`], register memory on [`Connection::pd`].
//!
//! rdma_cm gives a connection RDMA READ and atomics only when the two sides agree on
//! outstanding requests (`responder_resources` and `initiator_depth` above 0, both ways):
//! [`ConnectionOptions::default`] asks for 16 each way, so READ works out of the box.

use std::net::SocketAddr;
use std::time::Duration;

use super::channel::{EventChannel, WaitError};
use super::error::{CmaError, Result};
use super::event::{ConnParam, EventType};
use super::id::CmId;
use super::PortSpace;
use crate::transport::QpCaps;
use crate::verbs::{CompletionQueue, ProtectionDomain, Qp, QpInitAttr, QpType, Rc};

/// How [`Connection::connect`] and [`Listener::accept`] set a connection up.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConnectionOptions {
    /// Sent to the peer with the request (at most 56 bytes) or the acceptance (196).
    pub private_data: Vec<u8>,
    /// Entries of the connection's completion queue (sends and receives share it).
    pub cq_entries: u32,
    /// The queue pair's capacities.
    pub caps: QpCaps,
    /// RDMA READs and atomics this side serves, and issues, at a time (0: none: the peer's
    /// READs then fail).
    pub rd_atomic: u8,
    /// How long each step (address, route, connection) may take.
    pub timeout: Duration,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            private_data: Vec::new(),
            cq_entries: 256,
            caps: QpCaps::default(),
            rd_atomic: 16,
            timeout: Duration::from_secs(10),
        }
    }
}

impl ConnectionOptions {
    /// These options with `data` as the private data.
    pub fn with_private_data(mut self, data: &[u8]) -> Self {
        self.private_data = data.to_vec();
        self
    }

    /// The connection parameters these options ask for.
    pub(crate) fn param(&self) -> ConnParam {
        ConnParam {
            private_data: self.private_data.clone(),
            responder_resources: self.rd_atomic,
            initiator_depth: self.rd_atomic,
            ..ConnParam::default()
        }
    }
}

/// An established RC connection: its id, channel, PD, CQ and QP, and the private data the
/// peer sent. Dropping it disconnects and destroys it all.
pub struct Connection {
    // Field order is drop order: the QP before the CQ and PD, the id last.
    qp: Qp<Rc>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    peer_data: Vec<u8>,
    id: Option<CmId>,
    channel: EventChannel,
}

/// A failed wait, as an error that says what came instead.
fn waited(
    r: std::result::Result<super::CmEvent, WaitError>,
    what: &'static str,
) -> Result<Vec<u8>> {
    match r {
        Ok(ev) => Ok(ev.private_data().to_vec()),
        Err(WaitError::Timeout) => Err(CmaError::TimedOut(what)),
        Err(WaitError::Unexpected(ev)) => Err(CmaError::Unexpected {
            waiting_for: what,
            got: ev.event(),
            status: ev.status(),
        }),
    }
}

/// The PD of a connection on `id`'s device.
pub(crate) fn pd_of(id: &CmId) -> Result<ProtectionDomain> {
    Ok(id.context().ok_or(CmaError::NoDevice)?.alloc_pd()?)
}

/// The RC QP of a connection on `id`, in `pd`, completing into `cq`.
pub(crate) fn rc_qp(
    id: &CmId,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    o: &ConnectionOptions,
) -> Result<Qp<Rc>> {
    let attr = QpInitAttr {
        cap: o.caps,
        ..QpInitAttr::new(QpType::Rc, cq)
    };
    Ok(Qp::from_queue_pair(id.create_qp(pd, &attr)?)?)
}

/// The CQ and QP of a connection on `id`'s device, in `pd`.
fn cq_qp(
    id: &CmId,
    pd: &ProtectionDomain,
    o: &ConnectionOptions,
) -> Result<(CompletionQueue, Qp<Rc>)> {
    let ctx = id.context().ok_or(CmaError::NoDevice)?;
    let cq = ctx.create_cq(o.cq_entries, None)?;
    let qp = rc_qp(id, pd, &cq, o)?;
    Ok((cq, qp))
}

impl Connection {
    /// Connect to the rdma_cm listener at `to` (a [`Listener`], or librdmacm's `rdma_listen`,
    /// here or on another host).
    ///
    /// # Errors
    /// [`CmaError::TimedOut`] if a step took longer than `opts.timeout`;
    /// [`CmaError::Unexpected`] with the event that came instead (REJECTED: nobody listens
    /// there; UNREACHABLE: no answer); what the verbs return.
    pub fn connect(to: SocketAddr, opts: &ConnectionOptions) -> Result<Connection> {
        let channel = EventChannel::new()?;
        let id = channel.create_id(PortSpace::Tcp)?;
        id.resolve_addr(None, to, opts.timeout)?;
        waited(
            channel.wait_event(EventType::AddrResolved, opts.timeout),
            "ADDR_RESOLVED",
        )?;
        id.resolve_route(opts.timeout)?;
        waited(
            channel.wait_event(EventType::RouteResolved, opts.timeout),
            "ROUTE_RESOLVED",
        )?;
        let pd = pd_of(&id)?;
        let (cq, qp) = cq_qp(&id, &pd, opts)?;
        id.connect(&opts.param())?;
        let peer_data = waited(
            channel.wait_event(EventType::Established, opts.timeout),
            "ESTABLISHED",
        )?;
        Ok(Connection {
            qp,
            cq,
            pd,
            peer_data,
            id: Some(id),
            channel,
        })
    }

    /// The RC queue pair: post on it.
    pub fn qp(&self) -> &Qp<Rc> {
        &self.qp
    }

    /// The completion queue of the QP's sends and receives.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The protection domain: register memory the QP uses here.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The private data the peer sent with its request or acceptance, padded with zeros to the
    /// message's size (56 bytes for a request, 196 for an acceptance), as librdmacm reports it.
    pub fn peer_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// The rdma_cm id.
    pub fn id(&self) -> &CmId {
        self.id
            .as_ref()
            .expect("the id lives as long as the connection")
    }

    /// The address of the peer.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id().peer_socket_addr()
    }

    /// Wait up to `timeout` for the peer to disconnect (DISCONNECTED); true if it did.
    pub fn wait_disconnect(&self, timeout: Duration) -> bool {
        let t0 = std::time::Instant::now();
        while let Some(left) = timeout.checked_sub(t0.elapsed()) {
            match self.channel.get_cm_event_timeout(left) {
                Some(ev) if ev.event() == EventType::Disconnected => return true,
                Some(_) => continue,
                None => return false,
            }
        }
        false
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = id.disconnect();
            id.destroy();
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({:?} to {:?})", self.qp, self.peer_addr())
    }
}

/// An rdma_cm listener: [`Listener::accept`] takes one connection at a time.
pub struct Listener {
    id: Option<CmId>,
    channel: EventChannel,
}

impl Listener {
    /// Listen on `addr` (`0.0.0.0:0` for any address and a free port; see
    /// [`Listener::local_addr`]).
    ///
    ///
    /// ```
    /// # use softrdma::rdma_cm::*;
    /// let l = Listener::bind("127.0.0.1:0".parse().unwrap())?;
    /// assert_ne!(l.local_addr().unwrap().port(), 0);
    /// // A second listener on the same port is refused.
    /// assert!(matches!(Listener::bind(l.local_addr().unwrap()), Err(CmaError::AddrInUse)));
    /// # Ok::<(), CmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`CmaError::AddrInUse`] if another listener has the port; what the device open returns.
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        let channel = EventChannel::new()?;
        let id = channel.create_id(PortSpace::Tcp)?;
        id.bind_addr(addr)?;
        id.listen(64)?;
        Ok(Listener {
            id: Some(id),
            channel,
        })
    }

    /// The address and port it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref()?.local_socket_addr()
    }

    /// Wait for a connection request, and accept it with `opts` (its private data goes back to
    /// the peer).
    ///
    /// # Errors
    /// [`CmaError::TimedOut`] if the connection did not complete within `opts.timeout`; what
    /// the verbs return.
    pub fn accept(&self, opts: &ConnectionOptions) -> Result<Connection> {
        let o = opts.clone();
        self.accept_with(move |_| Ok(((), o))).map(|(c, ())| c)
    }

    /// [`Listener::accept`], with `prepare` run on the connection's protection domain before
    /// the acceptance goes out: register the memory the peer will use there, and return it with
    /// the options to accept with (their private data can tell the peer where the memory is).
    ///
    /// # Errors
    /// As [`Listener::accept`], or what `prepare` returns (the request is then rejected).
    pub fn accept_with<T>(
        &self,
        prepare: impl FnOnce(&ProtectionDomain) -> crate::verbs::Result<(T, ConnectionOptions)>,
    ) -> Result<(Connection, T)> {
        let ev = self.channel.get_cm_event()?;
        if ev.event() != EventType::ConnectRequest {
            return Err(CmaError::Unexpected {
                waiting_for: "CONNECT_REQUEST",
                got: ev.event(),
                status: ev.status(),
            });
        }
        let id = ev.id().clone();
        let request_data = ev.private_data().to_vec();
        drop(ev);
        // The connection's events go to a channel of its own.
        let channel = EventChannel::new()?;
        id.migrate(&channel);
        let made = pd_of(&id).and_then(|pd| {
            let (t, opts) = prepare(&pd)?;
            let (cq, qp) = cq_qp(&id, &pd, &opts)?;
            Ok((pd, cq, qp, t, opts))
        });
        let (pd, cq, qp, t, opts) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = id.reject(&[]);
                id.destroy();
                return Err(e);
            }
        };
        id.accept(&opts.param())?;
        waited(
            channel.wait_event(EventType::Established, opts.timeout),
            "ESTABLISHED",
        )?;
        let conn = Connection {
            qp,
            cq,
            pd,
            peer_data: request_data,
            id: Some(id),
            channel,
        };
        Ok((conn, t))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            id.destroy();
        }
    }
}
