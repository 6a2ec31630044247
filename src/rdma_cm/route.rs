//! Where an id lives: the process's rdma_cm devices (one open [`Context`] per device, shared by
//! every id, as librdmacm opens each device once), the choice of local device for a destination,
//! and the port table of each port space.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::{Mutex, OnceLock};

use super::error::{CmaError, Result};
use crate::cm::service_id::PortSpace;
use crate::verbs::{devices, Context, Device, VerbsError};

/// First and last ephemeral port (Linux `ip_local_port_range` defaults).
const EPHEMERAL: (u16, u16) = (32768, 60999);

#[derive(Default)]
struct Registry {
    /// Each device's default context, by device name.
    contexts: HashMap<String, Context>,
    /// Contexts bound to other addresses of a device on request (a given 127.x on `lo`).
    extra: Vec<Context>,
    /// Bound ports: (port space, port) -> addresses bound on it (UNSPECIFIED: wildcard).
    ports: HashMap<(PortSpace, u16), Vec<Ipv4Addr>>,
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
    Ok(c)
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

/// The context whose endpoint has address `a`. Any 127.x address is on `lo`: if no context has
/// it yet, one is bound to exactly that address (another process holding it: `AddrInUse`).
pub(crate) fn context_for_local(a: Ipv4Addr) -> Result<Context> {
    {
        let r = registry();
        if let Some(c) = r
            .contexts
            .values()
            .chain(r.extra.iter())
            .find(|c| c.addr() == a)
        {
            return Ok(c.clone());
        }
    }
    let devs = devices()?;
    if let Some(dev) = devs.iter().find(|d| d.addr() == a) {
        let c = context_for(dev)?;
        if c.addr() == a {
            return Ok(c);
        }
    }
    let lo = devs
        .iter()
        .find(|d| d.addr().is_loopback())
        .filter(|_| a.is_loopback())
        .ok_or(CmaError::AddrNotAvailable(a))?;
    let c = match lo.at(a).open() {
        Ok(c) => c,
        // Taken by another process.
        Err(VerbsError::AddrInUse(_)) => return Err(CmaError::AddrInUse),
        Err(e) => return Err(e.into()),
    };
    registry().extra.push(c.clone());
    Ok(c)
}

/// The context that reaches `dst`: a loopback destination goes out the loopback device; else
/// the device whose address the kernel's routing table picks as the source toward `dst`.
pub(crate) fn context_toward(dst: Ipv4Addr) -> Result<Context> {
    let devs = devices()?;
    if devs.is_empty() {
        return Err(CmaError::NoDevice);
    }
    if devs.len() == 1 {
        return context_for(&devs[0]);
    }
    if dst.is_loopback() {
        if let Some(d) = devs.iter().find(|d| d.addr().is_loopback()) {
            return context_for(d);
        }
    }
    if let Some(d) = devs.iter().find(|d| d.addr() == dst) {
        return context_for(d);
    }
    // Ask the routing table: a connected UDP socket learns its source address (no packet).
    let s = UdpSocket::bind("0.0.0.0:0")?;
    s.connect(SocketAddrV4::new(dst, 9))?;
    let src = match s.local_addr()? {
        std::net::SocketAddr::V4(a) => *a.ip(),
        _ => return Err(CmaError::NoDevice),
    };
    let d = devs
        .iter()
        .find(|d| d.addr() == src)
        .ok_or(CmaError::AddrNotAvailable(src))?;
    context_for(d)
}

/// Reserve `port` (0: an ephemeral one) on `addr` in port space `ps`. Returns the port.
pub(crate) fn bind_port(ps: PortSpace, addr: Ipv4Addr, port: u16) -> Result<u16> {
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
pub(crate) fn release_port(ps: PortSpace, addr: Ipv4Addr, port: u16) {
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
