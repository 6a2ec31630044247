//! `getopt_long` as rdma-core's and perftest's tools parse their command lines: short options
//! with a value (`-n 5`, `-n5`), short flags (`-e`), long names (`--iters=5`, `--iters 5`) and
//! positional arguments, in any order.

/// What a tool accepts.
pub struct Spec<'a> {
    /// Short options that take a value, e.g. `"pdisnm"`.
    pub with_value: &'a str,
    /// Short options that take none, e.g. `"e"`.
    pub flags: &'a str,
    /// Long names and the short option each stands for.
    pub long: &'a [(&'a str, char)],
}

/// One parsed argument.
pub enum Arg {
    /// An option, with its value if it takes one.
    Opt(char, Option<String>),
    Positional(String),
}

/// Parse `args` (without the program name).
pub fn parse(args: &[String], spec: &Spec<'_>) -> Result<Vec<Arg>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (opt, inline) = if let Some(long) = a.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let c = spec
                .long
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, c)| *c)
                .ok_or_else(|| format!("unknown option --{name}"))?;
            (c, val)
        } else if let Some(short) = a.strip_prefix('-').filter(|s| !s.is_empty()) {
            let c = short.chars().next().expect("non-empty");
            let rest = &short[c.len_utf8()..];
            (c, (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            out.push(Arg::Positional(a.clone()));
            continue;
        };
        if spec.flags.contains(opt) {
            out.push(Arg::Opt(opt, None));
        } else if spec.with_value.contains(opt) {
            let val = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("-{opt} needs a value"))?,
            };
            out.push(Arg::Opt(opt, Some(val)));
        } else {
            return Err(format!("unknown option -{opt}"));
        }
    }
    Ok(out)
}

/// `strtol(s, NULL, 0)`: decimal, `0x` hex or `0` octal.
pub fn c_num(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        i64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// A random 24-bit starting PSN, as the tools draw with `lrand48() & 0xffffff`.
pub fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).expect("getrandom");
    u32::from_le_bytes(b) & 0xff_ffff
}

/// `getaddrinfo` for IPv4: a dotted quad, or the first IPv4 address of a host name.
#[allow(dead_code)] // not every tool takes host names
pub fn ipv4_of(host: &str) -> Result<std::net::Ipv4Addr, String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    (host, 0)
        .to_socket_addrs()
        .map_err(|e| format!("getaddrinfo error: {host}: {e}"))?
        .find_map(|a| match a {
            SocketAddr::V4(a) => Some(*a.ip()),
            SocketAddr::V6(_) => None,
        })
        .ok_or_else(|| format!("getaddrinfo error: no IPv4 address for {host}"))
}

/// The address of `host`: an IPv4 or IPv6 literal as it is, a name's first IPv4 address (else
/// its first IPv6 one), as getaddrinfo's default order gives for these tools.
#[allow(dead_code)]
pub fn ip_of(host: &str) -> Result<std::net::IpAddr, String> {
    if let Ok(a) = host.parse::<std::net::IpAddr>() {
        return Ok(a);
    }
    match ipv4_of(host) {
        Ok(a) => Ok(a.into()),
        Err(e) => {
            use std::net::ToSocketAddrs;
            (host, 0)
                .to_socket_addrs()
                .ok()
                .and_then(|mut it| it.next())
                .map(|a| a.ip())
                .ok_or(e)
        }
    }
}
