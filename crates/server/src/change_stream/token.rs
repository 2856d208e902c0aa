//! Resume tokens: `{_data: "<hex>"}`, whose strings sort in event order, as mongod's do.
//!
//! `_data` is the hex of the event's position: the oplog entry's timestamp (8 bytes, big
//! endian), the operation's index inside a transaction's entry (4 bytes; 0 otherwise), a
//! kind byte (0 for an event, 1 for the invalidate that follows the event at that
//! position), and the fragment's number when `$changeStreamSplitLargeEvent` split the
//! event (4 bytes, from 1; 0 for a whole event). A high-water mark (a position between events, in `postBatchResumeToken` when
//! a batch ends with no event) has index `u32::MAX`: it sorts after every event of its
//! entry. Drivers treat tokens as opaque; only this server reads them back.

use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

/// A position in the stream of events: resuming from it returns the events after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub ts: u64,
    pub index: u32,
    pub invalidate: bool,
    pub fragment: u32,
}

const TOKEN_HEX_LEN: usize = 2 * (8 + 4 + 1 + 4);
/// A token without the fragment's number, as an earlier version issued them: a whole event.
const TOKEN_HEX_LEN_WHOLE: usize = 2 * (8 + 4 + 1);

impl Position {
    /// Before every event of entries after `ts`.
    pub fn high_water(ts: u64) -> Position {
        Position { ts, index: u32::MAX, invalidate: false, fragment: 0 }
    }

    /// The position of the event (or event fragment) `self` names, as a whole event.
    pub fn whole(self) -> Position {
        Position { fragment: 0, ..self }
    }

    pub fn token(&self) -> Document {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        let mut hex = String::with_capacity(TOKEN_HEX_LEN);
        for b in self.ts.to_be_bytes().iter().chain(&self.index.to_be_bytes()).chain(&[self.invalidate as u8]).chain(&self.fragment.to_be_bytes()) {
            hex.push(char::from(DIGITS[usize::from(b >> 4)]));
            hex.push(char::from(DIGITS[usize::from(b & 0xF)]));
        }
        doc! {"_data": hex}
    }

    /// The position a resume token names. InvalidResumeToken (260) for anything this
    /// server did not issue.
    pub fn from_token(token: &Bson) -> Result<Position> {
        let bad = || Error::new(Code::InvalidResumeToken, format!("invalid resume token: {token}"));
        let Bson::Document(d) = token else { return Err(bad()) };
        let Some(Bson::String(hex)) = d.get("_data") else { return Err(bad()) };
        if !(hex.len() == TOKEN_HEX_LEN || hex.len() == TOKEN_HEX_LEN_WHOLE) || !hex.is_ascii() {
            return Err(bad());
        }
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16)).collect::<std::result::Result<_, _>>().map_err(|_| bad())?;
        let ts = u64::from_be_bytes(bytes[..8].try_into().map_err(|_| bad())?);
        let index = u32::from_be_bytes(bytes[8..12].try_into().map_err(|_| bad())?);
        let invalidate = match bytes[12] {
            0 => false,
            1 => true,
            _ => return Err(bad()),
        };
        let fragment = match bytes.get(13..17) {
            Some(b) => u32::from_be_bytes(b.try_into().map_err(|_| bad())?),
            None => 0,
        };
        Ok(Position { ts, index, invalidate, fragment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_sort_in_event_order() {
        let positions = [
            Position { ts: 5, index: 0, invalidate: false, fragment: 0 },
            Position { ts: 5, index: 0, invalidate: false, fragment: 1 },
            Position { ts: 5, index: 0, invalidate: false, fragment: 2 },
            Position { ts: 5, index: 0, invalidate: true, fragment: 0 },
            Position { ts: 5, index: 1, invalidate: false, fragment: 0 },
            Position::high_water(5),
            Position { ts: 6 << 32, index: 0, invalidate: false, fragment: 0 },
        ];
        let tokens: Vec<String> = positions.iter().map(|p| p.token().get_str("_data").unwrap().to_string()).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        for p in positions {
            assert_eq!(Position::from_token(&Bson::Document(p.token())).unwrap(), p);
        }
        // A whole event's token without the fragment's number.
        assert_eq!(
            Position::from_token(&Bson::Document(doc! {"_data": "00".repeat(7) + "05" + "00000001" + "00"})).unwrap(),
            Position { ts: 5, index: 1, invalidate: false, fragment: 0 }
        );
        for bad in [Bson::Int32(1), Bson::Document(doc! {"_data": "zz"}), Bson::Document(doc! {"_data": "00".repeat(12) + "02" + &"00".repeat(4)})] {
            assert_eq!(Position::from_token(&bad).unwrap_err().code, 260);
        }
    }
}
