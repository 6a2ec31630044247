//! 24-bit packet sequence numbers with wrapping arithmetic (IBA 9.7.1).

use core::fmt;

/// A packet sequence number: 24 bits, compared within a window of 2^23 (IBA 9.7.1.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the 24 significant bits.
    pub const MASK: u32 = 0x00ff_ffff;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MASK)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    pub const fn add(self, n: u32) -> Self {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n`, wrapping at 2^24.
    pub const fn sub(self, n: u32) -> Self {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// Signed distance `self - other`, in `-2^23 .. 2^23`.
    pub const fn diff(self, other: Psn) -> i32 {
        let d = self.0.wrapping_sub(other.0) & Self::MASK;
        // Sign-extend from 24 bits.
        ((d << 8) as i32) >> 8
    }

    /// True if `self` comes before `other` in sequence space.
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True if `self` comes after `other` in sequence space.
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        let p = Psn::new(0xff_fffe);
        assert_eq!(p.add(1).value(), 0xff_ffff);
        assert_eq!(p.add(2).value(), 0);
        assert_eq!(p.add(5).value(), 3);
        assert_eq!(Psn::new(2).sub(5).value(), 0xff_fffd);
        assert_eq!(Psn::new(0x1_234_567).value(), 0x234_567);
    }

    #[test]
    fn compares_across_wrap() {
        let a = Psn::new(0xff_fff0);
        let b = Psn::new(0x10);
        assert_eq!(b.diff(a), 0x20);
        assert_eq!(a.diff(b), -0x20);
        assert!(a.before(b));
        assert!(b.after(a));
        assert!(!a.after(a));
        assert_eq!(Psn::new(0).diff(Psn::new(0x80_0000)), -0x80_0000);
    }
}
