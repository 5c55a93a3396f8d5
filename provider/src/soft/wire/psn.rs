//! 24-bit transport numbers: packet sequence numbers, queue pair numbers
//! and partition keys.

use core::fmt;

/// Mask of the 24 bits a PSN (and a QPN, and an MSN) occupies on the wire.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Bits of a 24-bit number shifted out when sign-extending it to 32 bits.
const SIGN_EXTEND_SHIFT: u32 = 32 - 24;

/// A packet sequence number: 24 bits that wrap (IBTA Vol. 1 §9.2, BTH PSN).
///
/// Comparisons are circular, like TCP sequence numbers: `a` is before `b`
/// when `b` lies less than half the space (2^23) ahead of `a`. Plain `<` on
/// PSNs would be wrong across the wrap, so `Psn` deliberately does not
/// implement `Ord`; use [`Psn::distance`], [`Psn::is_before`] and
/// [`Psn::is_after`].
///
/// # Examples
///
/// ```
/// use softverbs::soft::wire::Psn;
///
/// let last = Psn::new(0xff_ffff);
/// let next = last.wrapping_add(1);
/// assert_eq!(next.value(), 0);
/// assert_eq!(last.distance(next), 1);
/// assert!(last.is_before(next));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// PSN 0.
    pub const ZERO: Psn = Psn(0);
    /// The largest PSN, 2^24 - 1; the next one is [`Psn::ZERO`].
    pub const MAX: Psn = Psn(PSN_MASK);

    /// Makes a PSN from the low 24 bits of `value` (higher bits dropped).
    pub const fn new(value: u32) -> Psn {
        Psn(value & PSN_MASK)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` steps later, modulo 2^24.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// The PSN `n` steps earlier, modulo 2^24.
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & PSN_MASK)
    }

    /// The PSN after this one.
    #[must_use]
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }

    /// Signed circular distance from `self` to `other`: `other - self`
    /// modulo 2^24, read as a number in `[-2^23, 2^23)`.
    ///
    /// Positive means `other` is ahead of `self`. The one ambiguous gap,
    /// exactly 2^23, reads as `-2^23` in both directions.
    pub const fn distance(self, other: Psn) -> i32 {
        let forward = other.0.wrapping_sub(self.0) & PSN_MASK;
        // Shift the 24-bit two's-complement value into the top of an i32 and
        // back, which sign-extends it. `forward` < 2^24, so nothing is lost.
        ((forward << SIGN_EXTEND_SHIFT) as i32) >> SIGN_EXTEND_SHIFT
    }

    /// Whether `self` comes strictly before `other` in circular order.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance(other) > 0
    }

    /// Whether `self` comes strictly after `other` in circular order.
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// The later of `self` and `other` in circular order.
    pub const fn later(self, other: Psn) -> Psn {
        if self.is_after(other) {
            self
        } else {
            other
        }
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A queue pair number: 24 bits (IBTA Vol. 1 §9.2, BTH DestQP; §9.3 DETH
/// SrcQP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Qpn(u32);

impl Qpn {
    /// QP1, the general services interface QP (used by the CM).
    pub const GSI: Qpn = Qpn(1);
    /// QPN 0xFFFFFF, the destination QP of every multicast packet.
    pub const MULTICAST: Qpn = Qpn(PSN_MASK);

    /// Makes a QPN from the low 24 bits of `value` (higher bits dropped).
    pub const fn new(value: u32) -> Qpn {
        Qpn(value & PSN_MASK)
    }

    /// The QPN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl From<Qpn> for u32 {
    fn from(qpn: Qpn) -> u32 {
        qpn.0
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Bit 15 of a P_Key: set for full members of the partition.
const PKEY_FULL_MEMBER: u16 = 0x8000;

/// A partition key as carried in the BTH (IBTA Vol. 1 §10.9).
///
/// The low 15 bits name the partition; bit 15 is the membership type
/// (1 = full, 0 = limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pkey(u16);

impl Pkey {
    /// 0xFFFF: full membership of the default partition, what RoCE devices
    /// (rxe, mlx5) put in every packet.
    pub const DEFAULT: Pkey = Pkey(0xffff);

    /// Wraps a raw 16-bit P_Key.
    pub const fn new(value: u16) -> Pkey {
        Pkey(value)
    }

    /// The raw 16-bit value.
    pub const fn value(self) -> u16 {
        self.0
    }

    /// The partition number: the low 15 bits.
    pub const fn base(self) -> u16 {
        self.0 & !PKEY_FULL_MEMBER
    }

    /// Whether this key grants full (rather than limited) membership.
    pub const fn is_full_member(self) -> bool {
        self.0 & PKEY_FULL_MEMBER != 0
    }

    /// IBTA P_Key matching: same partition, and at least one side a full
    /// member (two limited members may not talk).
    pub const fn matches(self, other: Pkey) -> bool {
        self.base() == other.base() && (self.is_full_member() || other.is_full_member())
    }
}

impl Default for Pkey {
    fn default() -> Pkey {
        Pkey::DEFAULT
    }
}

impl fmt::Display for Pkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_masks_to_24_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Qpn::new(0xff00_0011).value(), 0x11);
        assert_eq!(Psn::MAX.value(), PSN_MASK);
    }

    #[test]
    fn wrapping_arithmetic() {
        assert_eq!(Psn::MAX.next(), Psn::ZERO);
        assert_eq!(Psn::ZERO.wrapping_sub(1), Psn::MAX);
        assert_eq!(Psn::new(10).wrapping_add(u32::MAX), Psn::new(9));
        assert_eq!(Psn::new(5).wrapping_add(1 << 24), Psn::new(5));
    }

    #[test]
    fn later_is_circular() {
        let a = Psn::new(0xff_fffe);
        let b = Psn::new(3);
        assert_eq!(a.later(b), b);
        assert_eq!(b.later(a), b);
        assert_eq!(a.later(a), a);
    }

    #[test]
    fn distance_is_signed_and_circular() {
        let a = Psn::new(100);
        assert_eq!(a.distance(a), 0);
        assert_eq!(a.distance(Psn::new(101)), 1);
        assert_eq!(a.distance(Psn::new(99)), -1);
        assert_eq!(Psn::MAX.distance(Psn::ZERO), 1);
        assert_eq!(Psn::ZERO.distance(Psn::MAX), -1);
        let half = 1u32 << 23;
        assert_eq!(Psn::ZERO.distance(Psn::new(half - 1)), (half - 1) as i32);
        assert_eq!(Psn::ZERO.distance(Psn::new(half)), -(half as i32));
        assert_eq!(Psn::new(half).distance(Psn::ZERO), -(half as i32));
        assert_eq!(Psn::ZERO.distance(Psn::new(half + 1)), -((half - 1) as i32));
    }

    #[test]
    fn ordering_helpers() {
        let a = Psn::new(0xff_fff0);
        let b = a.wrapping_add(0x20);
        assert!(a.is_before(b));
        assert!(b.is_after(a));
        assert!(!a.is_after(b));
        assert!(!a.is_before(a) && !a.is_after(a));
    }

    #[test]
    fn distance_agrees_with_wrapping_add() {
        for start in [0u32, 1, 0x7f_ffff, 0x80_0000, 0xff_ffff, 0x12_3456] {
            for step in [0i32, 1, -1, 1000, -1000, (1 << 23) - 1, -(1 << 23)] {
                let a = Psn::new(start);
                let b = a.wrapping_add(step as u32);
                assert_eq!(a.distance(b), step, "start {start:#x} step {step}");
            }
        }
    }

    #[test]
    fn pkey_membership() {
        assert!(Pkey::DEFAULT.is_full_member());
        assert_eq!(Pkey::DEFAULT.base(), 0x7fff);
        let limited = Pkey::new(0x7fff);
        assert!(Pkey::DEFAULT.matches(limited));
        assert!(!limited.matches(limited));
        assert!(!Pkey::new(0x8001).matches(Pkey::new(0x8002)));
        assert_eq!(Pkey::default(), Pkey::DEFAULT);
    }
}
