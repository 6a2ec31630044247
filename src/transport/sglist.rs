//! A work request's scatter/gather list, kept inline when it is short (most are one or two
//! elements), so that posting a work request allocates nothing.

use std::ops::Deref;

use super::types::Sge;

/// Elements held without an allocation.
const INLINE: usize = 2;

/// The scatter/gather list of a work request: a slice of [`Sge`]s (it dereferences to one).
#[derive(Clone, Debug)]
pub struct SgList(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Inline { len: u8, sges: [Sge; INLINE] },
    Heap(Vec<Sge>),
}

impl SgList {
    /// A list of `sges` (copied; allocates only past [`INLINE`] elements).
    pub fn from_slice(sges: &[Sge]) -> SgList {
        if sges.len() <= INLINE {
            let mut inline = [Sge::default(); INLINE];
            inline[..sges.len()].copy_from_slice(sges);
            SgList(Repr::Inline {
                len: sges.len() as u8,
                sges: inline,
            })
        } else {
            SgList(Repr::Heap(sges.to_vec()))
        }
    }
}

impl Default for SgList {
    fn default() -> SgList {
        SgList::from_slice(&[])
    }
}

impl Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match &self.0 {
            Repr::Inline { len, sges } => &sges[..*len as usize],
            Repr::Heap(v) => v,
        }
    }
}

impl From<Vec<Sge>> for SgList {
    fn from(v: Vec<Sge>) -> SgList {
        if v.len() <= INLINE {
            SgList::from_slice(&v)
        } else {
            SgList(Repr::Heap(v))
        }
    }
}

impl From<&[Sge]> for SgList {
    fn from(s: &[Sge]) -> SgList {
        SgList::from_slice(s)
    }
}

/// Collects without an allocation up to [`INLINE`] elements.
impl FromIterator<Sge> for SgList {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> SgList {
        let mut inline = [Sge::default(); INLINE];
        let mut it = iter.into_iter();
        let mut len = 0;
        while len < INLINE {
            match it.next() {
                Some(s) => {
                    inline[len] = s;
                    len += 1;
                }
                None => {
                    return SgList(Repr::Inline {
                        len: len as u8,
                        sges: inline,
                    })
                }
            }
        }
        match it.next() {
            None => SgList(Repr::Inline {
                len: len as u8,
                sges: inline,
            }),
            Some(s) => {
                let mut v = inline.to_vec();
                v.push(s);
                v.extend(it);
                SgList(Repr::Heap(v))
            }
        }
    }
}

/// Two lists are equal when their elements are (however they are held).
impl PartialEq for SgList {
    fn eq(&self, other: &SgList) -> bool {
        **self == **other
    }
}

impl Eq for SgList {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(n: u32) -> Sge {
        Sge {
            addr: n as u64 * 0x1000,
            length: n,
            lkey: n + 7,
        }
    }

    #[test]
    fn holds_any_length_as_the_slice_it_was_made_from() {
        for n in 0..6u32 {
            let v: Vec<Sge> = (1..=n).map(sge).collect();
            let a = SgList::from_slice(&v);
            let b = SgList::from(v.clone());
            assert_eq!(&*a, &v[..]);
            assert_eq!(&*b, &v[..]);
            assert_eq!(a, b);
            assert_eq!(a.len(), n as usize);
            assert_eq!(matches!(a.0, Repr::Inline { .. }), n as usize <= INLINE);
        }
        for n in 0..6u32 {
            let c: SgList = (1..=n).map(sge).collect();
            assert_eq!(c, SgList::from(((1..=n).map(sge)).collect::<Vec<_>>()));
            assert_eq!(matches!(c.0, Repr::Inline { .. }), n as usize <= INLINE);
        }
        assert_ne!(SgList::from_slice(&[sge(1)]), SgList::from_slice(&[sge(2)]));
        assert!(SgList::default().is_empty());
    }
}
