//! Where an id lives: the process's rdma_cm devices (one open [`Context`] per device, shared by
//! every id, as librdmacm opens each device once), the choice of local device for a destination,
//! and the port table of each port space.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Mutex, OnceLock};

use super::error::{CmaError, Result};
use crate::cm::service_id::PortSpace;
use crate::verbs::{devices, Context, Device};

/// First and last ephemeral port (Linux `ip_local_port_range` defaults).
const EPHEMERAL: (u16, u16) = (32768, 60999);

#[derive(Default)]
struct Registry {
    /// Each device's default context, by device name.
    contexts: HashMap<String, Context>,
    /// Contexts bound to other addresses of a device on request (a given 127.x on `lo`).
    extra: Vec<Context>,
    /// Bound ports: (port space, port) -> addresses bound on it (`0.0.0.0` or `::`: wildcard).
    ports: HashMap<(PortSpace, u16), Vec<IpAddr>>,
    next_ephemeral: u16,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            next_ephemeral: EPHEMERAL.0 + (std::process::id() % 20000) as u16,
            ..Default::default()
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

/// The context of `dev`, opened on first use and kept for the life of the process.
pub(crate) fn context_for(dev: &Device) -> Result<Context> {
    let mut r = registry();
    if let Some(c) = r.contexts.get(dev.name()) {
        return Ok(c.clone());
    }
    let c = dev.open()?;
    r.contexts.insert(dev.name().to_string(), c.clone());
    at_exit_disconnect();
    Ok(c)
}

/// At normal process exit, disconnect what the program left connected, as Linux does when it
/// closes an exiting process's rdma_cm fd: otherwise a peer that waits for DISCONNECTED
/// (perftest's `ib_*_lat -R` client, whose server just returns from `main`) waits for its own
/// DREQ to time out. Registered after the device's sockets joined their groups, so it runs
/// before they leave (`atexit` handlers run in reverse order). A process that is killed sends
/// nothing; its peers time out, as with any peer that vanishes.
fn at_exit_disconnect() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn on_exit() {
        let ctxs: Vec<Context> = {
            let r = registry();
            r.contexts.values().chain(r.extra.iter()).cloned().collect()
        };
        for c in ctxs {
            c.disconnect_all_at_exit();
        }
    }
    ONCE.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(on_exit) };
    });
}

/// Every device's context that can be opened (a wildcard listener listens on all of them). A
/// device whose address another process's endpoint holds (a second wildcard server on one
/// machine) is skipped; only if none can be opened is it an error.
pub(crate) fn all_contexts() -> Result<Vec<Context>> {
    let devs = devices()?;
    let mut out = Vec::new();
    let mut last = CmaError::NoDevice;
    for d in &devs {
        match context_for(d) {
            Ok(c) => out.push(c),
            Err(e) => last = e,
        }
    }
    if out.is_empty() {
        return Err(last);
    }
    Ok(out)
}

/// Whether the context's endpoint is bound to `a` (IPv4 or IPv6).
fn has_addr(c: &Context, a: IpAddr) -> bool {
    c.ip_addrs().contains(&a)
}

/// The context whose endpoint has address `a` (IPv4 or IPv6). Any 127.x address is on `lo`: if
/// no context has it yet, one is bound to exactly that address (another process holding it:
/// `AddrInUse`).
pub(crate) fn context_for_local(a: IpAddr) -> Result<Context> {
    {
        let r = registry();
        if let Some(c) = r
            .contexts
            .values()
            .chain(r.extra.iter())
            .find(|c| has_addr(c, a))
        {
            return Ok(c.clone());
        }
    }
    let devs = devices()?;
    let on_dev = |d: &&Device| match a {
        IpAddr::V4(v4) => d.ipv4() == Some(v4),
        IpAddr::V6(v6) => d.ipv6_addrs().contains(&v6),
    };
    if let Some(dev) = devs.iter().find(on_dev) {
        let c = context_for(dev)?;
        if has_addr(&c, a) {
            return Ok(c);
        }
    }
    let IpAddr::V4(a) = a else {
        return Err(CmaError::AddrNotAvailable(a));
    };
    let lo = devs
        .iter()
        .find(|d| d.addr().is_loopback())
        .filter(|_| a.is_loopback())
        .ok_or(CmaError::AddrNotAvailable(a.into()))?;
    // Taken by another user or program: the error says who (EADDRINUSE).
    let c = lo.at(a).open()?;
    registry().extra.push(c.clone());
    at_exit_disconnect();
    Ok(c)
}

/// The context that reaches `dst` (IPv4 or IPv6; a link-local IPv6 address with its scope),
/// and the local address it reaches it from: a loopback destination goes out the loopback
/// device; else the device whose address the kernel's routing table picks as the source toward
/// `dst`.
pub(crate) fn context_toward(dst: SocketAddr) -> Result<(Context, IpAddr)> {
    let devs = devices()?;
    if devs.is_empty() {
        return Err(CmaError::NoDevice);
    }
    let ip = dst.ip();
    let of = |d: &Device, a: IpAddr| match a {
        IpAddr::V4(v4) => d.ipv4() == Some(v4),
        IpAddr::V6(v6) => d.ipv6_addrs().contains(&v6),
    };
    let same_family = |c: &Context, a: IpAddr| {
        c.ip_addrs()
            .into_iter()
            .find(|l| l.is_ipv4() == a.is_ipv4())
            .ok_or(CmaError::AddrNotAvailable(a))
    };
    if devs.len() == 1 {
        // One device (`SOFTRDMA_ADDR`): it is the way out.
        let c = context_for(&devs[0])?;
        let local = same_family(&c, ip)?;
        return Ok((c, local));
    }
    // The source: the destination itself when it is ours, the loopback address of its family
    // toward loopback, else what the routing table picks (a connected UDP socket learns its
    // source address; no packet is sent).
    let src = if devs.iter().any(|d| of(d, ip)) {
        ip
    } else if ip.is_loopback() {
        match ip {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        }
    } else {
        let any: SocketAddr = match dst {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let s = UdpSocket::bind(any)?;
        let mut to = dst;
        to.set_port(9);
        s.connect(to)?;
        s.local_addr()?.ip()
    };
    let d = if src.is_loopback() && src.is_ipv4() {
        // Any 127.x is the loopback device's (its context may be on another one).
        devs.iter().find(|d| d.addr().is_loopback())
    } else {
        devs.iter().find(|d| of(d, src))
    }
    .ok_or(CmaError::AddrNotAvailable(src))?;
    let c = context_for(d)?;
    // The context's own address of that family (a loopback context may be on another 127.x).
    let local = if has_addr(&c, src) {
        src
    } else {
        same_family(&c, src)?
    };
    Ok((c, local))
}

/// Reserve `port` (0: an ephemeral one) on `addr` in port space `ps`. Returns the port. As
/// Linux's rdma_cm (`cma_check_port`, with `bindv6only` 0): a wildcard of either family
/// conflicts with every other binding of the port, and two bindings of one address conflict.
pub(crate) fn bind_port(ps: PortSpace, addr: IpAddr, port: u16) -> Result<u16> {
    let mut r = registry();
    let conflicts = |r: &Registry, p: u16| {
        r.ports.get(&(ps, p)).is_some_and(|v| {
            v.iter()
                .any(|b| b.is_unspecified() || addr.is_unspecified() || *b == addr)
        })
    };
    let port = if port != 0 {
        if conflicts(&r, port) {
            return Err(CmaError::AddrInUse);
        }
        port
    } else {
        let span = EPHEMERAL.1 - EPHEMERAL.0 + 1;
        let mut found = None;
        for _ in 0..span {
            let p = r.next_ephemeral;
            r.next_ephemeral = if p >= EPHEMERAL.1 { EPHEMERAL.0 } else { p + 1 };
            if !conflicts(&r, p) {
                found = Some(p);
                break;
            }
        }
        found.ok_or(CmaError::NoPorts)?
    };
    r.ports.entry((ps, port)).or_default().push(addr);
    Ok(port)
}

/// Give back a reservation made by [`bind_port`].
pub(crate) fn release_port(ps: PortSpace, addr: IpAddr, port: u16) {
    let mut r = registry();
    if let Some(v) = r.ports.get_mut(&(ps, port)) {
        if let Some(i) = v.iter().position(|b| *b == addr) {
            v.swap_remove(i);
        }
        if v.is_empty() {
            r.ports.remove(&(ps, port));
        }
    }
}
