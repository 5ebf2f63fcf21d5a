//! Loopback addresses for cluster members, which must know each other's address before any of
//! them starts (so they cannot bind `127.0.0.1:0` and report back).
//!
//! A port bound on `:0` and released comes from the kernel's ephemeral range, the same range
//! every outgoing connection takes its local port from. Between the release and the member's
//! bind, any connection on the machine (a Raft RPC of another test's cluster, a client) may
//! take that port, or another test may be handed it again; CI saw both (a member refused with
//! `Address already in use`, and two test clusters sharing a port). So ports are drawn from
//! just below the ephemeral range, where the kernel never hands one out by itself, and each is
//! handed out once per process.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// How many ports below the ephemeral range are drawn from.
const SPAN: u16 = 12_000;

/// Ports this process has handed out (never handed out twice).
static HANDED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// The lowest port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A pseudo-random number that differs between processes and calls (no crate needed: the
/// ports only have to be spread, not unpredictable).
fn spread(counter: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    let mut x =
        (u64::from(std::process::id()) << 32) ^ nanos ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A free loopback address for a server to bind: a port below the ephemeral range, not handed
/// out before by this process, and free when checked.
///
/// # Panics
/// When no port of the span is free (thousands of tries).
pub fn free_addr() -> String {
    let high = ephemeral_low().max(1024 + SPAN);
    let low = high - SPAN;
    let mut handed = HANDED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let handed = handed.get_or_insert_with(HashSet::new);
    for attempt in 0..u64::from(SPAN) * 2 {
        let offset = u16::try_from(spread(attempt) % u64::from(SPAN)).expect("below SPAN");
        let port = low + offset;
        if handed.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            handed.insert(port);
            let addr = listener
                .local_addr()
                .expect("a bound listener has an address");
            return addr.to_string();
        }
    }
    panic!("no free loopback port in {low}..{high}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_bindable_and_never_handed_out_twice() {
        let low = ephemeral_low();
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let addr: std::net::SocketAddr = free_addr().parse().unwrap();
            assert!(addr.port() < low, "{addr} is in the ephemeral range");
            assert!(seen.insert(addr.port()), "{addr} handed out twice");
            TcpListener::bind(addr).expect("a handed-out port is free");
        }
    }
}
