//! Recursive-descent parser. Statements are lines; an error skips to the next line so that one
//! run reports every broken line.

use crate::ast::*;
use crate::diag::{Diagnostic, Span};
use crate::lexer::{Tok, Token, lex};

pub fn parse(src: &str) -> Result<FlowAst, Vec<Diagnostic>> {
    let tokens = lex(src).map_err(|d| vec![d])?;
    let mut p = Parser {
        tokens,
        pos: 0,
        errors: Vec::new(),
    };
    let ast = p.file();
    if p.errors.is_empty() {
        Ok(ast)
    } else {
        Err(p.errors)
    }
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    errors: Vec<Diagnostic>,
}

enum Where {
    Top,
    Cache,
    Index,
}

type PResult<T> = Result<T, Diagnostic>;

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.pos]
    }

    fn next(&mut self) -> Token {
        let t = self.tokens[self.pos].clone();
        if !matches!(t.tok, Tok::Eof) {
            self.pos += 1;
        }
        t
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(&self.peek().tok, Tok::Punct(q) if *q == p)
    }

    fn eat_punct(&mut self, p: &str) -> bool {
        let yes = self.is_punct(p);
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn expect_punct(&mut self, p: &str) -> PResult<Span> {
        if self.is_punct(p) {
            Ok(self.next().span)
        } else {
            Err(self.unexpected(&format!("'{p}'")))
        }
    }

    fn expect_ident(&mut self, what: &str) -> PResult<(String, Span)> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                Ok((s, self.next().span))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn expect_newline(&mut self) -> PResult<()> {
        match self.peek().tok {
            Tok::Newline | Tok::Eof => {
                self.next();
                Ok(())
            }
            _ => Err(self.unexpected("the end of the line")),
        }
    }

    fn unexpected(&self, expected: &str) -> Diagnostic {
        let t = self.peek();
        let found = match &t.tok {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Number(n) => format!("number {n}"),
            Tok::Str(s) => format!("string \"{s}\""),
            Tok::Punct(p) => format!("'{p}'"),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of file".into(),
        };
        Diagnostic::new(t.span, format!("unexpected {found}")).expected(expected)
    }

    fn skip_line(&mut self) {
        while !matches!(self.peek().tok, Tok::Newline | Tok::Eof) {
            self.pos += 1;
        }
        self.next();
    }

    fn file(&mut self) -> FlowAst {
        let mut ast = FlowAst::new("");
        let mut at = Where::Top;
        let mut seen_flow = false;
        loop {
            match &self.peek().tok {
                Tok::Eof => break,
                Tok::Newline => {
                    self.next();
                    continue;
                }
                _ => {}
            }
            if let Err(d) = self.line(&mut ast, &mut at, &mut seen_flow) {
                self.errors.push(d);
                self.skip_line();
            }
        }
        if !seen_flow && self.errors.is_empty() {
            self.errors.push(
                Diagnostic::new(Span::new(1, 1, 1), "a flow must start with its name")
                    .expected("'flow NAME'"),
            );
        }
        ast
    }

    fn line(&mut self, ast: &mut FlowAst, at: &mut Where, seen_flow: &mut bool) -> PResult<()> {
        let (word, span) = match &self.peek().tok {
            Tok::Ident(s) => (s.clone(), self.peek().span),
            _ => return Err(self.unexpected("a declaration or a statement")),
        };
        let next_is_colon = matches!(&self.tokens[self.pos + 1].tok, Tok::Punct(":"));
        match word.as_str() {
            "flow" if !*seen_flow => {
                self.next();
                let (name, name_span) = self.expect_ident("the flow's name")?;
                ast.name = name;
                ast.name_span = name_span;
                if let Tok::Str(s) = &self.peek().tok {
                    ast.about = Some(s.clone());
                    self.next();
                }
                *seen_flow = true;
                return self.expect_newline();
            }
            _ if !*seen_flow => {
                return Err(Diagnostic::new(span, "a flow must start with its name")
                    .expected("'flow NAME'"));
            }
            "cache" | "index" if next_is_colon => {
                self.next();
                self.next();
                self.expect_newline()?;
                let section = Section {
                    span,
                    stmts: vec![],
                };
                let slot = if word == "cache" {
                    &mut ast.cache
                } else {
                    &mut ast.index
                };
                if slot.is_some() {
                    return Err(Diagnostic::new(
                        span,
                        format!("the {word} phase is declared twice"),
                    ));
                }
                *slot = Some(section);
                *at = if word == "cache" {
                    Where::Cache
                } else {
                    Where::Index
                };
                return Ok(());
            }
            "param" | "const" | "page" | "state" if matches!(at, Where::Top) => {
                self.next();
                return self.declaration(&word, ast);
            }
            "param" | "const" | "page" | "state" => {
                return Err(Diagnostic::new(
                    span,
                    format!("'{word}' declarations go before the phases"),
                ));
            }
            _ => {}
        }
        let section = match at {
            Where::Top => {
                return Err(Diagnostic::new(span, format!("unexpected '{word}'"))
                    .expected("'param', 'const', 'page', 'state', 'cache:' or 'index:'"));
            }
            Where::Cache => ast.cache.as_mut().unwrap(),
            Where::Index => ast.index.as_mut().unwrap(),
        };
        let stmt = if matches!(&self.tokens[self.pos + 1].tok, Tok::Punct("=")) {
            self.next();
            self.next();
            Stmt::Let {
                name: word,
                span,
                expr: self.expr()?,
            }
        } else {
            Stmt::Call(self.expr()?)
        };
        section.stmts.push(stmt);
        self.expect_newline()
    }

    fn declaration(&mut self, kind: &str, ast: &mut FlowAst) -> PResult<()> {
        let (name, span) = self.expect_ident(&format!("the {kind}'s name"))?;
        match kind {
            "param" => {
                self.expect_punct("=")?;
                let mut values = vec![self.signed_number()?];
                while self.eat_punct(",") {
                    values.push(self.signed_number()?);
                }
                ast.params.push(ParamDecl { name, span, values });
            }
            _ => {
                self.expect_punct("[")?;
                let rows = self.expr()?;
                self.expect_punct(",")?;
                let cols = self.expr()?;
                self.expect_punct("]")?;
                match kind {
                    "const" => {
                        self.expect_punct("=")?;
                        let init = self.expr()?;
                        ast.consts.push(ConstDecl {
                            name,
                            span,
                            rows,
                            cols,
                            init,
                        });
                    }
                    _ => {
                        let dtype = match &self.peek().tok {
                            Tok::Ident(s) => {
                                let s = s.clone();
                                Some((s, self.next().span))
                            }
                            _ => None,
                        };
                        let decl = FieldDecl {
                            name,
                            span,
                            rows,
                            cols,
                            dtype,
                        };
                        if kind == "page" {
                            ast.pages.push(decl)
                        } else {
                            ast.states.push(decl)
                        }
                    }
                }
            }
        }
        self.expect_newline()
    }

    fn signed_number(&mut self) -> PResult<(f64, Span)> {
        let neg = self.is_punct("-").then(|| self.next().span);
        match self.peek().tok {
            Tok::Number(n) => {
                let span = self.next().span;
                Ok(match neg {
                    Some(s) => (-n, s.to(span)),
                    None => (n, span),
                })
            }
            _ => Err(self.unexpected("a number")),
        }
    }

    fn expr(&mut self) -> PResult<Expr> {
        let lhs = self.additive()?;
        for op in [">=", "<=", "==", "!=", ">", "<"] {
            if self.is_punct(op) {
                let span = self.next().span;
                let rhs = self.additive()?;
                return Ok(Expr::Binary {
                    op,
                    span,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                });
            }
        }
        Ok(lhs)
    }

    fn additive(&mut self) -> PResult<Expr> {
        let mut lhs = self.term()?;
        loop {
            let op = if self.is_punct("+") {
                "+"
            } else if self.is_punct("-") {
                "-"
            } else {
                return Ok(lhs);
            };
            let span = self.next().span;
            let rhs = self.term()?;
            lhs = Expr::Binary {
                op,
                span,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            };
        }
    }

    fn term(&mut self) -> PResult<Expr> {
        let mut lhs = self.unary()?;
        loop {
            let op = if self.is_punct("*") {
                "*"
            } else if self.is_punct("/") {
                "/"
            } else {
                return Ok(lhs);
            };
            let span = self.next().span;
            let rhs = self.unary()?;
            lhs = Expr::Binary {
                op,
                span,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            };
        }
    }

    fn unary(&mut self) -> PResult<Expr> {
        if self.is_punct("-") {
            let span = self.next().span;
            let inner = self.unary()?;
            return Ok(Expr::Neg(Box::new(inner), span));
        }
        self.primary()
    }

    fn primary(&mut self) -> PResult<Expr> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Number(n) => {
                self.next();
                Ok(Expr::Num(n, t.span))
            }
            Tok::Ident(name) => {
                self.next();
                if !self.eat_punct("(") {
                    return Ok(Expr::Name(name, t.span));
                }
                let mut args = Vec::new();
                if !self.eat_punct(")") {
                    loop {
                        args.push(self.expr()?);
                        if self.eat_punct(")") {
                            break;
                        }
                        if !self.eat_punct(",") {
                            return Err(self.unexpected("',' or ')'"));
                        }
                    }
                }
                Ok(Expr::Call {
                    name,
                    span: t.span,
                    args,
                })
            }
            Tok::Punct("(") => {
                self.next();
                let e = self.expr()?;
                self.expect_punct(")")?;
                Ok(e)
            }
            _ => Err(self.unexpected("an expression")),
        }
    }
}
