//! The type checker of a flow's expressions: each expression's type from what it reads, and
//! refusals of what the two stores would compute differently (see the module above).

use super::portable::{castable, is_plain_number, literal_beside_time};
use super::{ColumnType, Fields, cast_type};
use sqlparser::ast::{
    BinaryOperator, CastKind, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, InTarget,
    UnaryOperator, Value,
};

/// The functions an expression may call: the same name, arguments and meaning on both stores.
const FUNCTIONS: &[&str] = &[
    "coalesce", "nullif", "lower", "upper", "length", "abs", "round", "substr", "replace",
];

/// An expression's type as the checker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ty {
    Known(ColumnType),
    /// A string literal: PostgreSQL reads it as whatever type it meets.
    StringLiteral,
    /// NULL.
    Null,
}

impl Ty {
    pub(super) fn known(self) -> Option<ColumnType> {
        match self {
            Self::Known(ty) => Some(ty),
            Self::StringLiteral => Some(ColumnType::Text),
            Self::Null => None,
        }
    }
}

pub(super) struct Checker<'a> {
    pub(super) fields: Fields<'a>,
    /// Columns written out as other expressions (a view's columns as the view computes them).
    pub(super) substitutes: Option<&'a super::Substitutes>,
}

impl Checker<'_> {
    pub(super) fn ty(&self, expr: &Expr) -> Result<Ty, String> {
        use ColumnType as C;
        Ok(match expr {
            Expr::Identifier(ident) => {
                let name = ident.value.as_str();
                match self.fields.iter().find(|(field, _)| field == name) {
                    Some((_, ty)) => Ty::Known(*ty),
                    None => {
                        let known: Vec<&str> =
                            self.fields.iter().map(|(f, _)| f.as_str()).collect();
                        return Err(format!(
                            "unknown column `{name}`; the columns are {}",
                            known.join(", ")
                        ));
                    }
                }
            }
            Expr::CompoundIdentifier(parts) => {
                return Err(format!(
                    "`{}`: name a column by itself (there is one source)",
                    expr_text(parts)
                ));
            }
            Expr::Value(value) => match &value.value {
                Value::Number(text, _) => {
                    if !is_plain_number(text) {
                        return Err(format!(
                            "the number `{text}`: write numbers in decimal (`1000`, `2.5`, \
                             `1e3`), as both stores read them"
                        ));
                    }
                    if text.contains(['.', 'e', 'E']) {
                        Ty::Known(C::Numeric)
                    } else {
                        Ty::Known(C::Integer)
                    }
                }
                Value::SingleQuotedString(_) => Ty::StringLiteral,
                Value::Boolean(_) => Ty::Known(C::Boolean),
                Value::Null => Ty::Null,
                other => return Err(format!("the literal `{other}` is not supported")),
            },
            Expr::Nested(inner) => self.ty(inner)?,
            Expr::IsNull(inner) | Expr::IsNotNull(inner) => {
                self.ty(inner)?;
                Ty::Known(C::Boolean)
            }
            Expr::IsTrue(inner)
            | Expr::IsFalse(inner)
            | Expr::IsNotTrue(inner)
            | Expr::IsNotFalse(inner) => {
                self.boolean(inner, "IS TRUE / IS FALSE")?;
                Ty::Known(C::Boolean)
            }
            Expr::UnaryOp { op, expr } => match op {
                UnaryOperator::Not => {
                    self.boolean(expr, "NOT")?;
                    Ty::Known(C::Boolean)
                }
                UnaryOperator::Minus | UnaryOperator::Plus => {
                    let ty = self.ty(expr)?;
                    self.number(ty, &format!("unary {op}"))?;
                    ty
                }
                other => return Err(format!("the operator `{other}` is not supported")),
            },
            Expr::BinaryOp { left, op, right } => self.binary(left, op, right)?,
            Expr::Between {
                expr, low, high, ..
            } => {
                let ty = self.ty(expr)?;
                self.comparable(ty, self.ty(low)?, "BETWEEN")?;
                self.comparable(ty, self.ty(high)?, "BETWEEN")?;
                Ty::Known(C::Boolean)
            }
            Expr::In {
                expr,
                target: InTarget::List(list),
                ..
            } => {
                let ty = self.ty(expr)?;
                for item in list {
                    self.comparable(ty, self.ty(item)?, "IN")?;
                }
                Ty::Known(C::Boolean)
            }
            Expr::Like {
                expr,
                pattern,
                escape_char: None,
                any: false,
                ..
            } => {
                self.text(expr, "LIKE")?;
                self.text(pattern, "LIKE")?;
                Ty::Known(C::Boolean)
            }
            Expr::Case {
                operand,
                conditions,
                else_result,
                ..
            } => {
                let operand = operand.as_deref().map(|o| self.ty(o)).transpose()?;
                let mut result = Ty::Null;
                let mut branches = Vec::new();
                for when in conditions {
                    match operand {
                        Some(operand) => {
                            self.comparable(operand, self.ty(&when.condition)?, "CASE")?;
                        }
                        None => self.boolean(&when.condition, "CASE WHEN")?,
                    }
                    let branch = self.ty(&when.result)?;
                    result = self.unify(result, branch, "CASE")?;
                    branches.push(branch);
                }
                if let Some(other) = else_result {
                    let branch = self.ty(other)?;
                    result = self.unify(result, branch, "CASE")?;
                    branches.push(branch);
                }
                literal_beside_time(result, branches.into_iter(), "CASE")?;
                result
            }
            Expr::Cast {
                kind: CastKind::Cast | CastKind::DoubleColon,
                expr,
                data_type,
                format: None,
            } => {
                let to = cast_type(&data_type.to_string())?;
                let from = self.ty(expr)?;
                if !castable(from, to) {
                    return Err(format!(
                        "CAST from {} to {}: not the same on both stores (cast from text, \
                         between numbers, to text from numbers, dates, times and json, or \
                         between dates and timestamps)",
                        describe(from),
                        to.keyword()
                    ));
                }
                Ty::Known(to)
            }
            Expr::Function(function) => self.function(function)?,
            Expr::Substring {
                expr,
                substring_from,
                substring_for,
                ..
            } => {
                self.text(expr, "substr")?;
                for count in [substring_from, substring_for].into_iter().flatten() {
                    if !matches!(self.ty(count)?, Ty::Known(C::Integer) | Ty::Null) {
                        return Err("`substr` counts in integers".to_owned());
                    }
                }
                if substring_from.is_none() {
                    return Err("`substr` needs where to start".to_owned());
                }
                Ty::Known(C::Text)
            }
            other => {
                return Err(format!(
                    "`{other}` is not supported: sluice's expressions are the part of SQL that \
                     behaves the same on SQLite and PostgreSQL (columns, literals, arithmetic, \
                     comparisons, AND/OR/NOT, IS NULL, IN, BETWEEN, LIKE, CASE, CAST, ->>, ||, \
                     and the functions {})",
                    FUNCTIONS.join(", ")
                ));
            }
        })
    }

    fn binary(&self, left: &Expr, op: &BinaryOperator, right: &Expr) -> Result<Ty, String> {
        use BinaryOperator as B;
        use ColumnType as C;
        let (l, r) = (self.ty(left)?, self.ty(right)?);
        Ok(match op {
            B::And | B::Or => {
                self.boolean(left, &op.to_string())?;
                self.boolean(right, &op.to_string())?;
                Ty::Known(C::Boolean)
            }
            B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq => {
                self.comparable(l, r, &op.to_string())?;
                Ty::Known(C::Boolean)
            }
            B::Modulo => {
                for side in [l, r] {
                    if !matches!(side, Ty::Known(C::Integer) | Ty::Null) {
                        return Err(format!(
                            "`%` takes integers (found {}); PostgreSQL has no `%` on doubles",
                            describe(side)
                        ));
                    }
                }
                Ty::Known(C::Integer)
            }
            B::Plus | B::Minus | B::Multiply | B::Divide => {
                self.number(l, &op.to_string())?;
                self.number(r, &op.to_string())?;
                self.unify(l, r, &op.to_string())?
            }
            B::StringConcat => {
                for side in [l, r] {
                    if !matches!(side, Ty::Null | Ty::StringLiteral | Ty::Known(C::Text)) {
                        return Err(format!(
                            "`||` joins text; CAST the other side AS text (found {})",
                            describe(side)
                        ));
                    }
                }
                Ty::Known(C::Text)
            }
            B::LongArrow | B::Arrow => {
                if l != Ty::Known(C::Json) {
                    return Err(format!("`{op}` reads a json value (found {})", describe(l)));
                }
                if !matches!(right, Expr::Value(_))
                    || !matches!(r, Ty::StringLiteral | Ty::Known(C::Integer))
                {
                    return Err(format!(
                        "`{op}` takes a key ('name') or an index (1), written as a literal"
                    ));
                }
                if *op == B::LongArrow {
                    Ty::Known(C::Text)
                } else {
                    Ty::Known(C::Json)
                }
            }
            other => return Err(format!("the operator `{other}` is not supported")),
        })
    }

    fn function(&self, function: &sqlparser::ast::Function) -> Result<Ty, String> {
        use ColumnType as C;
        let name = function.name.to_string().to_lowercase();
        if !FUNCTIONS.contains(&name.as_str()) {
            return Err(format!(
                "the function `{name}` is not supported (the same on both stores: {})",
                FUNCTIONS.join(", ")
            ));
        }
        if function.filter.is_some() || function.over.is_some() || !function.within_group.is_empty()
        {
            return Err(format!(
                "`{name}`: FILTER, OVER and WITHIN GROUP are not supported"
            ));
        }
        let FunctionArguments::List(list) = &function.args else {
            return Err(format!("`{name}` needs its arguments in parentheses"));
        };
        if list.duplicate_treatment.is_some() || !list.clauses.is_empty() {
            return Err(format!("`{name}`: only plain arguments are supported"));
        }
        let mut args = Vec::new();
        for arg in &list.args {
            let FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) = arg else {
                return Err(format!("`{name}`: only plain arguments are supported"));
            };
            args.push((expr, self.ty(expr)?));
        }
        let arity = |range: std::ops::RangeInclusive<usize>| {
            if range.contains(&args.len()) {
                Ok(())
            } else {
                Err(format!(
                    "`{name}` takes {} arguments, not {}",
                    if range.start() == range.end() {
                        range.start().to_string()
                    } else {
                        format!("{} to {}", range.start(), range.end())
                    },
                    args.len()
                ))
            }
        };
        Ok(match name.as_str() {
            "coalesce" => {
                arity(2..=64)?;
                let mut ty = Ty::Null;
                for (_, arg) in &args {
                    ty = self.unify(ty, *arg, "coalesce")?;
                }
                literal_beside_time(ty, args.iter().map(|(_, t)| *t), "coalesce")?;
                ty
            }
            "nullif" => {
                arity(2..=2)?;
                self.comparable(args[0].1, args[1].1, "nullif")?;
                args[0].1
            }
            "lower" | "upper" => {
                arity(1..=1)?;
                self.text(args[0].0, &name)?;
                Ty::Known(C::Text)
            }
            "length" => {
                arity(1..=1)?;
                self.text(args[0].0, &name)?;
                Ty::Known(C::Integer)
            }
            "substr" => {
                arity(2..=3)?;
                self.text(args[0].0, &name)?;
                for (_, ty) in &args[1..] {
                    if !matches!(ty, Ty::Known(C::Integer) | Ty::Null) {
                        return Err(format!(
                            "`substr` counts in integers (found {})",
                            describe(*ty)
                        ));
                    }
                }
                Ty::Known(C::Text)
            }
            "replace" => {
                arity(3..=3)?;
                for (expr, _) in &args {
                    self.text(expr, &name)?;
                }
                Ty::Known(C::Text)
            }
            "abs" => {
                arity(1..=1)?;
                self.number(args[0].1, &name)?;
                args[0].1
            }
            "round" => {
                arity(1..=2)?;
                self.number(args[0].1, &name)?;
                if let Some((_, places)) = args.get(1)
                    && !matches!(places, Ty::Known(C::Integer))
                {
                    return Err("`round`'s places are an integer".to_owned());
                }
                // PostgreSQL rounds a double only to an integer; with places, a numeric.
                match (args[0].1, args.len()) {
                    (Ty::Known(C::Double), 2) => {
                        return Err(
                            "`round(x, places)` takes a numeric: CAST(x AS numeric)".to_owned()
                        );
                    }
                    (ty, _) => ty,
                }
            }
            _ => unreachable_function(&name)?,
        })
    }

    fn boolean(&self, expr: &Expr, at: &str) -> Result<(), String> {
        match self.ty(expr)? {
            Ty::Known(ColumnType::Boolean) | Ty::Null => Ok(()),
            other => Err(format!("{at} needs a boolean (found {})", describe(other))),
        }
    }

    fn text(&self, expr: &Expr, at: &str) -> Result<(), String> {
        match self.ty(expr)? {
            Ty::Known(ColumnType::Text) | Ty::StringLiteral | Ty::Null => Ok(()),
            other => Err(format!(
                "{at} needs text (found {}); CAST it AS text",
                describe(other)
            )),
        }
    }

    fn number(&self, ty: Ty, at: &str) -> Result<(), String> {
        match ty {
            Ty::Known(t) if t.is_number() => Ok(()),
            Ty::Null => Ok(()),
            other => Err(format!("`{at}` needs numbers (found {})", describe(other))),
        }
    }

    fn comparable(&self, a: Ty, b: Ty, at: &str) -> Result<(), String> {
        self.unify(a, b, at).map(|_| ())
    }

    /// The type two values share, for comparisons, arithmetic and CASE branches.
    fn unify(&self, a: Ty, b: Ty, at: &str) -> Result<Ty, String> {
        use ColumnType as C;
        Ok(match (a, b) {
            (Ty::Null, other) | (other, Ty::Null) => other,
            (Ty::StringLiteral, Ty::StringLiteral) => Ty::StringLiteral,
            // A string literal is read as the other side's type (a timestamp, a date, text);
            // a number is not, on SQLite, so that is refused.
            (Ty::StringLiteral, Ty::Known(t)) | (Ty::Known(t), Ty::StringLiteral) => {
                if t.is_number() || t == C::Boolean || t == C::Bytes {
                    return Err(format!(
                        "{at}: a string literal next to {} (write the value without quotes, or \
                         CAST it)",
                        t.keyword()
                    ));
                }
                Ty::Known(t)
            }
            (Ty::Known(x), Ty::Known(y)) if x == y => Ty::Known(x),
            (Ty::Known(x), Ty::Known(y)) if x.is_number() && y.is_number() => {
                if x == C::Double || y == C::Double {
                    Ty::Known(C::Double)
                } else {
                    Ty::Known(C::Numeric)
                }
            }
            (Ty::Known(x), Ty::Known(y)) => {
                return Err(format!(
                    "{at}: {} and {} do not mix; CAST one of them",
                    x.keyword(),
                    y.keyword()
                ));
            }
        })
    }
}

fn unreachable_function(name: &str) -> Result<Ty, String> {
    Err(format!("the function `{name}` is not supported"))
}

pub(super) fn describe(ty: Ty) -> String {
    match ty {
        Ty::Known(t) => t.keyword().to_owned(),
        Ty::StringLiteral => "a string literal".to_owned(),
        Ty::Null => "NULL".to_owned(),
    }
}

fn expr_text(parts: &[sqlparser::ast::Ident]) -> String {
    parts
        .iter()
        .map(|p| p.value.as_str())
        .collect::<Vec<_>>()
        .join(".")
}
