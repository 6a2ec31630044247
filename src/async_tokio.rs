//! Awaitable completions and connection events on tokio (feature `tokio`): the completion
//! channel's and the rdma_cm event channel's fds go into tokio's reactor ([`AsyncFd`]), so a
//! task sleeps until the transport has something for it, with no thread of its own.
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use softrdma::rdma_cm::ConnectionOptions;
//! use softrdma::tokio::{connect, AsyncCq};
//! let conn = connect("127.0.0.1:7471".parse()?, &ConnectionOptions::default()).await?;
//! let mr = conn.pd().alloc_mr(64, softrdma::verbs::AccessFlags::LOCAL_WRITE)?;
//! conn.qp().send(mr.slice(..8)?).post()?;
//! let wc = conn.cq().next().await?.ok()?;
//! # let _ = wc; Ok(()) }
//! ```

use std::net::SocketAddr;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;

use crate::rdma_cm::connection;
use crate::rdma_cm::{CmEvent, CmaError, ConnectionOptions, EventChannel, EventType, PortSpace};
use crate::verbs::{
    CompletionChannel, CompletionQueue, Context, ProtectionDomain, Qp, Rc, Result, VerbsError,
    WorkCompletion,
};

/// A completion queue with a completion channel of its own in tokio's reactor:
/// [`AsyncCq::next`] awaits the next completion (arming the CQ, taking and acknowledging its
/// channel's events, arming again, for the caller).
pub struct AsyncCq {
    cq: CompletionQueue,
    chan: AsyncFd<CompletionChannel>,
}

impl AsyncCq {
    /// A CQ of `entries` on `ctx`, with its own channel. Call from within a tokio runtime.
    ///
    /// # Errors
    /// What [`Context::create_cq`] returns, or the reactor's registration error.
    pub fn new(ctx: &Context, entries: u32) -> Result<AsyncCq> {
        let chan = ctx.create_comp_channel()?;
        chan.set_nonblocking(true)?;
        let cq = ctx.create_cq(entries, Some(&chan))?;
        // SAFETY: the channel owns its fd and neither closes nor replaces it while the AsyncFd
        // owns the channel.
        let chan = unsafe { AsyncFd::register_with_interest(chan, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(AsyncCq { cq, chan })
    }

    /// The completion queue (create QPs on it; poll it directly if you like).
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The next completion.
    ///
    /// # Errors
    /// What [`CompletionQueue::poll`] returns. A completion with an error status is returned
    /// as it is ([`WorkCompletion::ok`] makes it an error).
    pub async fn next(&self) -> Result<WorkCompletion> {
        loop {
            if let Some(c) = self.cq.poll_one()? {
                return Ok(c);
            }
            self.cq.req_notify(false)?;
            // A completion that came before the arm raises no event: look again.
            if let Some(c) = self.cq.poll_one()? {
                return Ok(c);
            }
            let mut ready = self.chan.readable().await?;
            match self.chan.get_ref().get_cq_event() {
                Ok(cq) => cq.ack_events(1),
                Err(VerbsError::WouldBlock) => ready.clear_ready(),
                Err(e) => return Err(e),
            }
        }
    }
}

/// An rdma_cm event channel in tokio's reactor: [`AsyncEventChannel::next`] awaits the next
/// event.
pub struct AsyncEventChannel {
    chan: AsyncFd<EventChannel>,
}

impl AsyncEventChannel {
    /// A new channel. Call from within a tokio runtime.
    ///
    /// # Errors
    /// What [`EventChannel::new`] returns, or the reactor's registration error.
    pub fn new() -> std::result::Result<AsyncEventChannel, CmaError> {
        let chan = EventChannel::new()?;
        chan.set_nonblocking(true)?;
        // SAFETY: as in `AsyncCq::new`: the channel owns its fd for as long as it lives.
        let chan = unsafe { AsyncFd::register_with_interest(chan, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(AsyncEventChannel { chan })
    }

    /// The channel (create ids on it).
    pub fn channel(&self) -> &EventChannel {
        self.chan.get_ref()
    }

    /// The next event.
    ///
    /// # Errors
    /// What [`EventChannel::get_cm_event`] returns.
    pub async fn next(&self) -> std::result::Result<CmEvent, CmaError> {
        loop {
            let mut ready = self.chan.readable().await?;
            match self.chan.get_ref().get_cm_event() {
                Ok(ev) => return Ok(ev),
                Err(CmaError::WouldBlock) => ready.clear_ready(),
                Err(e) => return Err(e),
            }
        }
    }

    /// The next event, which must be `want`.
    async fn expect(&self, want: EventType) -> std::result::Result<CmEvent, CmaError> {
        let ev = self.next().await?;
        if ev.event() == want {
            Ok(ev)
        } else {
            Err(CmaError::Unexpected {
                waiting_for: want.as_str(),
                got: ev.event(),
                status: ev.status(),
            })
        }
    }
}

/// An RC connection made with [`connect`] or [`AsyncListener::accept`]: the objects of a
/// [`crate::rdma_cm::Connection`], with an awaitable CQ. Dropping it disconnects.
pub struct AsyncConnection {
    qp: Qp<Rc>,
    cq: AsyncCq,
    pd: ProtectionDomain,
    peer_data: Vec<u8>,
    id: Option<crate::rdma_cm::CmId>,
    events: AsyncEventChannel,
}

impl AsyncConnection {
    /// The RC queue pair.
    pub fn qp(&self) -> &Qp<Rc> {
        &self.qp
    }
    /// The awaitable completion queue of the QP's sends and receives.
    pub fn cq(&self) -> &AsyncCq {
        &self.cq
    }
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
    /// The private data the peer sent.
    pub fn peer_data(&self) -> &[u8] {
        &self.peer_data
    }
    /// Await the peer's disconnection.
    ///
    /// # Errors
    /// What the event channel returns.
    pub async fn disconnected(&self) -> std::result::Result<(), CmaError> {
        loop {
            if self.events.next().await?.event() == EventType::Disconnected {
                return Ok(());
            }
        }
    }
}

impl Drop for AsyncConnection {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = id.disconnect();
            id.destroy();
        }
    }
}

/// The PD, awaitable CQ and RC QP of a connection on `id` (as a [`crate::rdma_cm::Connection`]
/// has, with the CQ in the reactor).
fn objects(
    id: &crate::rdma_cm::CmId,
    o: &ConnectionOptions,
) -> std::result::Result<(ProtectionDomain, AsyncCq, Qp<Rc>), CmaError> {
    let ctx = id.context().ok_or(CmaError::NoDevice)?;
    let pd = connection::pd_of(id)?;
    let cq = AsyncCq::new(&ctx, o.cq_entries)?;
    let qp = connection::rc_qp(id, &pd, cq.cq(), o)?;
    Ok((pd, cq, qp))
}

/// Connect to the rdma_cm listener at `to`, awaiting each step.
///
/// # Errors
/// [`CmaError::Unexpected`] with the event that came instead of the one awaited (REJECTED:
/// nobody listens there); what the verbs return.
pub async fn connect(
    to: SocketAddr,
    opts: &ConnectionOptions,
) -> std::result::Result<AsyncConnection, CmaError> {
    let events = AsyncEventChannel::new()?;
    let id = events.channel().create_id(PortSpace::Tcp)?;
    id.resolve_addr(None, to, opts.timeout)?;
    drop(events.expect(EventType::AddrResolved).await?);
    id.resolve_route(opts.timeout)?;
    drop(events.expect(EventType::RouteResolved).await?);
    let (pd, cq, qp) = objects(&id, opts)?;
    id.connect(&opts.param())?;
    let ev = events.expect(EventType::Established).await?;
    let peer_data = ev.private_data().to_vec();
    drop(ev);
    Ok(AsyncConnection {
        qp,
        cq,
        pd,
        peer_data,
        id: Some(id),
        events,
    })
}

/// An rdma_cm listener whose requests are awaited.
pub struct AsyncListener {
    id: Option<crate::rdma_cm::CmId>,
    events: AsyncEventChannel,
}

impl AsyncListener {
    /// Listen on `addr`.
    ///
    /// # Errors
    /// [`CmaError::AddrInUse`] if another listener has the port.
    pub fn bind(addr: SocketAddr) -> std::result::Result<AsyncListener, CmaError> {
        let events = AsyncEventChannel::new()?;
        let id = events.channel().create_id(PortSpace::Tcp)?;
        id.bind_addr(addr)?;
        id.listen(64)?;
        Ok(AsyncListener {
            id: Some(id),
            events,
        })
    }

    /// The address and port it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref()?.local_socket_addr()
    }

    /// Await a connection request and accept it with `opts`.
    ///
    /// # Errors
    /// What the verbs and the event channel return.
    pub async fn accept(
        &self,
        opts: &ConnectionOptions,
    ) -> std::result::Result<AsyncConnection, CmaError> {
        let ev = self.events.expect(EventType::ConnectRequest).await?;
        let id = ev.id().clone();
        let peer_data = ev.private_data().to_vec();
        drop(ev);
        let events = AsyncEventChannel::new()?;
        id.migrate(events.channel());
        let (pd, cq, qp) = match objects(&id, opts) {
            Ok(o) => o,
            Err(e) => {
                let _ = id.reject(&[]);
                id.destroy();
                return Err(e);
            }
        };
        id.accept(&opts.param())?;
        drop(events.expect(EventType::Established).await?);
        Ok(AsyncConnection {
            qp,
            cq,
            pd,
            peer_data,
            id: Some(id),
            events,
        })
    }
}

impl Drop for AsyncListener {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            id.destroy();
        }
    }
}
