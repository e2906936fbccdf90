//! Exact-match scoring: every expected answer must appear in the generated text as a whole
//! word (a number inside a longer number does not count).

/// Whether `output` contains every one of `answers` as a whole word.
pub fn exact_match(output: &str, answers: &[String]) -> bool {
    !answers.is_empty() && answers.iter().all(|a| contains_word(output, a))
}

fn contains_word(text: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    let is_word = |c: char| c.is_alphanumeric();
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn whole_words_only() {
        assert!(exact_match(" 68217. Remember", &s(&["68217"])));
        assert!(!exact_match(" 682170", &s(&["68217"])));
        assert!(!exact_match(" 6821", &s(&["68217"])));
        assert!(exact_match(
            "ABCDE, FGHIJ and KLMNO",
            &s(&["KLMNO", "ABCDE", "FGHIJ"])
        ));
        assert!(!exact_match("ABCDE, FGHIJ", &s(&["KLMNO", "ABCDE"])));
        assert!(!exact_match("anything", &[]));
    }
}
