//! A flow's SQL expressions (`select:` values, `where:`), checked here and evaluated by the
//! store inside the commit's transaction (DESIGN §8: no expression interpreter of our own).
//!
//! An expression is parsed with `sqlparser` (PostgreSQL's syntax, which Lakeflow users write
//! too), then checked against the fields it may read: every name must be one of them, every
//! operator and function must be in the subset that behaves the same on SQLite and PostgreSQL,
//! and the types must fit (a number compared with text, `AND` over a number, a `where:` that is
//! not boolean are errors here, not surprises in one store). It is then written out once per
//! store: identifiers quoted, casts as PostgreSQL's `CAST(x AS type)` or, on SQLite, as
//! sluice's strict cast functions (`sluice_cast_<type>(x)`, which fail on a value PostgreSQL's
//! cast would refuse, where SQLite's own `CAST` would give 0).

use crate::columns::ColumnType;
use sqlparser::ast::{
    BinaryOperator, CastKind, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, InTarget,
    UnaryOperator, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

/// A checked expression and its text for each store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expression {
    /// As the file wrote it.
    pub text: String,
    /// For PostgreSQL.
    pub postgres: String,
    /// For SQLite (with sluice's strict cast functions registered).
    pub sqlite: String,
    /// Its type; `None` when only NULL (or an untyped literal) decides it.
    pub ty: Option<ColumnType>,
}

/// What an expression may read: each field's name and type.
pub type Fields<'a> = &'a [(String, ColumnType)];

/// The functions an expression may call: the same name, arguments and meaning on both stores.
const FUNCTIONS: &[&str] = &[
    "coalesce", "nullif", "lower", "upper", "length", "abs", "round", "substr", "replace",
];

/// Parses and checks `text` over `fields`.
pub fn compile(text: &str, fields: Fields<'_>) -> Result<Expression, String> {
    let dialect = PostgreSqlDialect {};
    let mut parser = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|e| format!("not an SQL expression: {e}"))?;
    let expr = parser
        .parse_expr()
        .map_err(|e| format!("not an SQL expression: {e}"))?;
    let rest = parser.peek_token();
    if rest.token != Token::EOF {
        return Err(format!(
            "not one SQL expression: `{}` follows it",
            rest.token
        ));
    }
    let checker = Checker { fields };
    let ty = checker.ty(&expr)?;
    Ok(Expression {
        text: text.to_owned(),
        postgres: render(&expr, Store::Postgres, &checker)?,
        sqlite: render(&expr, Store::Sqlite, &checker)?,
        ty: ty.known(),
    })
}

/// Checks that a compiled expression's values fit a column of type `column`.
pub fn fits(expression: &Expression, column: ColumnType) -> bool {
    match expression.ty {
        None => true,
        Some(ty) if ty == column => true,
        // Integers widen; a double or a decimal goes into either of the two.
        Some(ty) => {
            ty.is_number()
                && column.is_number()
                && !(column == ColumnType::Integer && ty != ColumnType::Integer)
        }
    }
}

/// An expression's type as the checker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Known(ColumnType),
    /// A string literal: PostgreSQL reads it as whatever type it meets.
    StringLiteral,
    /// NULL.
    Null,
}

impl Ty {
    fn known(self) -> Option<ColumnType> {
        match self {
            Self::Known(ty) => Some(ty),
            Self::StringLiteral => Some(ColumnType::Text),
            Self::Null => None,
        }
    }
}

struct Checker<'a> {
    fields: Fields<'a>,
}

impl Checker<'_> {
    fn ty(&self, expr: &Expr) -> Result<Ty, String> {
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

/// A value that is a timestamp or a date in one branch and a string literal in another would
/// be stored as that text on SQLite: the literal must be cast.
fn literal_beside_time(
    result: Ty,
    branches: impl Iterator<Item = Ty>,
    at: &str,
) -> Result<(), String> {
    let time = matches!(result, Ty::Known(ColumnType::Timestamp | ColumnType::Date));
    let mut branches = branches;
    if time && branches.any(|b| b == Ty::StringLiteral) {
        return Err(format!(
            "{at}: a string literal beside a {}: CAST it AS {}",
            describe(result),
            describe(result)
        ));
    }
    Ok(())
}

/// Whether both stores cast `from` to `to` alike.
fn castable(from: Ty, to: ColumnType) -> bool {
    use ColumnType as C;
    match from {
        Ty::Null | Ty::StringLiteral => true,
        Ty::Known(from) if from == to => true,
        Ty::Known(C::Text) => true,
        Ty::Known(from) if from.is_number() => to.is_number() || to == C::Text,
        Ty::Known(C::Timestamp) => matches!(to, C::Date | C::Text),
        Ty::Known(C::Date) => matches!(to, C::Timestamp | C::Text),
        Ty::Known(C::Json) => to == C::Text,
        Ty::Known(_) => false,
    }
}

/// `digits[.digits][e[+-]digits]` (or `.digits`): a number both stores read alike.
fn is_plain_number(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    !(whole.is_empty() && fraction.is_empty())
        && digits(whole)
        && digits(fraction)
        && exponent.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && digits(e)
        })
}

fn unreachable_function(name: &str) -> Result<Ty, String> {
    Err(format!("the function `{name}` is not supported"))
}

fn describe(ty: Ty) -> String {
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

/// The column type a `CAST(x AS type)` names.
fn cast_type(data_type: &str) -> Result<ColumnType, String> {
    use ColumnType as C;
    let word = data_type.to_lowercase();
    let base = word.split('(').next().unwrap_or("").trim();
    Ok(match base {
        "text" | "varchar" | "character varying" | "string" => C::Text,
        "integer" | "int" | "bigint" | "int8" | "int4" | "smallint" => C::Integer,
        "double" | "double precision" | "float8" | "float" | "real" => C::Double,
        "numeric" | "decimal" => C::Numeric,
        "boolean" | "bool" => C::Boolean,
        "timestamp" | "timestamptz" | "timestamp with time zone" => C::Timestamp,
        "date" => C::Date,
        "json" | "jsonb" => C::Json,
        "bytea" | "bytes" | "blob" => C::Bytes,
        _ => {
            return Err(format!(
                "CAST to `{data_type}`: the types are {}",
                ColumnType::keywords()
            ));
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Postgres,
    Sqlite,
}

/// The store's SQL for a column type.
pub fn postgres_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "TEXT",
        ColumnType::Integer => "BIGINT",
        ColumnType::Double => "DOUBLE PRECISION",
        ColumnType::Numeric => "NUMERIC",
        ColumnType::Boolean => "BOOLEAN",
        ColumnType::Timestamp => "TIMESTAMPTZ",
        ColumnType::Date => "DATE",
        ColumnType::Json => "JSONB",
        ColumnType::Bytes => "BYTEA",
    }
}

/// Writes a checked expression out for one store; `checker` gives the types that decide how
/// (a string literal read as a time, a division, a JSON text).
fn render(expr: &Expr, store: Store, checker: &Checker<'_>) -> Result<String, String> {
    let r = |e: &Expr| render(e, store, checker);
    let ty = |e: &Expr| checker.ty(e);
    // `e` as compared with a value of type `other`: a string literal beside a time is written as
    // that time.
    let beside = |e: &Expr, other: Ty| -> Result<String, String> {
        match (literal_text(e), other.known()) {
            (Some(text), Some(time @ (ColumnType::Timestamp | ColumnType::Date))) => {
                time_literal(text, time, store)
            }
            _ => r(e),
        }
    };
    Ok(match expr {
        Expr::Identifier(ident) => format!("\"{}\"", ident.value),
        Expr::Value(value) => match &value.value {
            Value::Number(text, _) => text.clone(),
            Value::SingleQuotedString(text) => format!("'{}'", text.replace('\'', "''")),
            Value::Boolean(true) => "TRUE".to_owned(),
            Value::Boolean(false) => "FALSE".to_owned(),
            Value::Null => "NULL".to_owned(),
            other => return Err(format!("the literal `{other}` is not supported")),
        },
        Expr::Nested(inner) => format!("({})", r(inner)?),
        Expr::IsNull(inner) => format!("({} IS NULL)", r(inner)?),
        Expr::IsNotNull(inner) => format!("({} IS NOT NULL)", r(inner)?),
        Expr::IsTrue(inner) => format!("({} IS TRUE)", r(inner)?),
        Expr::IsFalse(inner) => format!("({} IS FALSE)", r(inner)?),
        Expr::IsNotTrue(inner) => format!("({} IS NOT TRUE)", r(inner)?),
        Expr::IsNotFalse(inner) => format!("({} IS NOT FALSE)", r(inner)?),
        Expr::UnaryOp { op, expr } => format!("({op} {})", r(expr)?),
        Expr::BinaryOp { left, op, right } => {
            use BinaryOperator as B;
            let (lt, rt) = (ty(left)?, ty(right)?);
            match (op, store) {
                (B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq, _) => {
                    format!("({} {op} {})", beside(left, rt)?, beside(right, lt)?)
                }
                // SQLite divides integers when both values are stored as integers, which an
                // integral numeric is: a numeric or double division is done in floats, and a
                // zero divisor fails the record as on PostgreSQL.
                (B::Divide, Store::Sqlite) => {
                    let real = [lt, rt]
                        .iter()
                        .any(|t| matches!(t, Ty::Known(ColumnType::Numeric | ColumnType::Double)));
                    if real {
                        format!(
                            "(CAST({} AS REAL) / sluice_nonzero({}))",
                            r(left)?,
                            r(right)?
                        )
                    } else {
                        format!("({} / sluice_nonzero({}))", r(left)?, r(right)?)
                    }
                }
                (B::Modulo, Store::Sqlite) => {
                    format!("({} % sluice_nonzero({}))", r(left)?, r(right)?)
                }
                // SQLite's `->>` gives a JSON number as a number; PostgreSQL's gives text.
                (B::LongArrow, Store::Sqlite) => {
                    format!("CAST(({} ->> {}) AS TEXT)", r(left)?, r(right)?)
                }
                _ => format!("({} {op} {})", r(left)?, r(right)?),
            }
        }
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let t = ty(expr)?;
            format!(
                "({} {}BETWEEN {} AND {})",
                beside(expr, ty(low)?)?,
                if *negated { "NOT " } else { "" },
                beside(low, t)?,
                beside(high, t)?
            )
        }
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated,
            ..
        } => {
            let t = ty(expr)?;
            let items = list
                .iter()
                .map(|item| beside(item, t))
                .collect::<Result<Vec<_>, _>>()?;
            format!(
                "({} {}IN ({}))",
                r(expr)?,
                if *negated { "NOT " } else { "" },
                items.join(", ")
            )
        }
        Expr::Like {
            negated,
            expr,
            pattern,
            ..
        } => format!(
            "({} {}LIKE {}{})",
            r(expr)?,
            if *negated { "NOT " } else { "" },
            r(pattern)?,
            // PostgreSQL's default escape character; SQLite has none unless told.
            if store == Store::Sqlite {
                " ESCAPE '\\'"
            } else {
                ""
            }
        ),
        Expr::Case {
            operand,
            conditions,
            else_result,
            ..
        } => {
            let mut out = "(CASE".to_owned();
            let operand_ty = operand.as_deref().map(ty).transpose()?;
            if let Some(operand) = operand {
                out.push(' ');
                out.push_str(&r(operand)?);
            }
            for when in conditions {
                let condition = match operand_ty {
                    Some(t) => beside(&when.condition, t)?,
                    None => r(&when.condition)?,
                };
                out.push_str(&format!(" WHEN {condition} THEN {}", r(&when.result)?));
            }
            if let Some(other) = else_result {
                out.push_str(&format!(" ELSE {}", r(other)?));
            }
            out.push_str(" END)");
            out
        }
        Expr::Cast {
            expr, data_type, ..
        } => {
            let ty = cast_type(&data_type.to_string())?;
            match store {
                Store::Postgres => format!("CAST({} AS {})", r(expr)?, postgres_type(ty)),
                Store::Sqlite => format!("sluice_cast_{}({})", ty.keyword(), r(expr)?),
            }
        }
        Expr::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            let count = |e: &Expr| -> Result<String, String> {
                Ok(match store {
                    // PostgreSQL's `substr` counts in `integer`, not `bigint`.
                    Store::Postgres => format!("CAST({} AS INTEGER)", r(e)?),
                    Store::Sqlite => r(e)?,
                })
            };
            let mut args = vec![r(expr)?];
            for e in [substring_from, substring_for].into_iter().flatten() {
                args.push(count(e)?);
            }
            format!("substr({})", args.join(", "))
        }
        Expr::Function(function) => {
            let name = function.name.to_string().to_lowercase();
            let FunctionArguments::List(list) = &function.args else {
                return Err(format!("`{name}` needs its arguments in parentheses"));
            };
            let mut exprs = Vec::new();
            for arg in &list.args {
                let FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) = arg else {
                    return Err(format!("`{name}`: only plain arguments are supported"));
                };
                exprs.push(expr);
            }
            let mut args = Vec::new();
            for (i, expr) in exprs.iter().enumerate() {
                let text = match (name.as_str(), i) {
                    ("nullif", 1) => beside(expr, ty(exprs[0])?)?,
                    ("nullif", 0) => beside(expr, ty(exprs[1])?)?,
                    // PostgreSQL's `substr` and `round` count in `integer`, not `bigint`.
                    ("substr", 1 | 2) | ("round", 1) if store == Store::Postgres => {
                        format!("CAST({} AS INTEGER)", r(expr)?)
                    }
                    _ => r(expr)?,
                };
                args.push(text);
            }
            format!("{name}({})", args.join(", "))
        }
        other => return Err(format!("`{other}` is not supported")),
    })
}

fn literal_text(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::Value(value) => match &value.value {
            Value::SingleQuotedString(text) => Some(text),
            _ => None,
        },
        _ => None,
    }
}

/// A string literal read as a timestamp (ISO 8601; without an offset, UTC) or a date, written
/// in each store's form of that type, so that both compare times, not text.
fn time_literal(text: &str, ty: ColumnType, store: Store) -> Result<String, String> {
    let instant = parse_time(text).ok_or_else(|| {
        format!(
            "'{text}' is not a {} (ISO 8601: 2026-12-04, 2026-12-04T10:00:00Z)",
            ty.keyword()
        )
    })?;
    let (canonical, sql_type) = match ty {
        ColumnType::Date => (
            instant.to_zoned(jiff::tz::TimeZone::UTC).date().to_string(),
            "DATE",
        ),
        _ => (
            instant.strftime("%Y-%m-%dT%H:%M:%S.%3fZ").to_string(),
            "TIMESTAMPTZ",
        ),
    };
    Ok(match store {
        Store::Postgres => format!("CAST('{canonical}' AS {sql_type})"),
        Store::Sqlite => format!("'{canonical}'"),
    })
}

/// ISO 8601: with an offset, or without one read as UTC, or a date (midnight UTC).
fn parse_time(text: &str) -> Option<jiff::Timestamp> {
    let text = text.trim();
    if let Ok(instant) = text.parse::<jiff::Timestamp>() {
        return Some(instant);
    }
    if let Ok(civil) = text.parse::<jiff::civil::DateTime>() {
        return civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp());
    }
    text.parse::<jiff::civil::Date>()
        .ok()
        .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map(|z| z.timestamp())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ColumnType as C;

    fn fields() -> Vec<(String, ColumnType)> {
        [
            ("order_id", C::Text),
            ("amount", C::Numeric),
            ("qty", C::Integer),
            ("ts", C::Timestamp),
            ("vip", C::Boolean),
            ("_sluice_attributes", C::Json),
        ]
        .map(|(n, t)| (n.to_owned(), t))
        .to_vec()
    }

    fn ok(text: &str) -> Expression {
        compile(text, &fields()).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn err(text: &str) -> String {
        compile(text, &fields()).expect_err(text)
    }

    #[test]
    fn typed_expressions_render_for_both_stores() {
        let e = ok("CAST(amount AS numeric) * 100");
        assert_eq!(e.postgres, "(CAST(\"amount\" AS NUMERIC) * 100)");
        assert_eq!(e.sqlite, "(sluice_cast_numeric(\"amount\") * 100)");
        assert_eq!(e.ty, Some(C::Numeric));
        let e = ok("amount::integer");
        assert_eq!(e.sqlite, "sluice_cast_integer(\"amount\")");
        assert_eq!(ok("amount > 0 AND NOT vip").ty, Some(C::Boolean));
        assert_eq!(ok("_sluice_attributes ->> 'region'").ty, Some(C::Text));
        assert_eq!(ok("ts >= '2026-01-01'").ty, Some(C::Boolean));
        assert_eq!(
            ok("CASE WHEN qty > 10 THEN 'bulk' ELSE 'single' END").ty,
            Some(C::Text)
        );
        assert_eq!(ok("coalesce(upper(order_id), 'none')").ty, Some(C::Text));
        assert_eq!(ok("qty IN (1, 2, 3)").ty, Some(C::Boolean));
        assert_eq!(ok("'it''s'").sqlite, "'it''s'");
    }

    #[test]
    fn what_would_differ_between_stores_is_refused() {
        assert!(err("amountt + 1").contains("unknown column `amountt`"));
        assert!(err("order_id > 3").contains("do not mix"));
        assert!(err("amount > '3'").contains("string literal next to numeric"));
        assert!(err("qty AND vip").contains("needs a boolean"));
        assert!(err("now()").contains("function `now`"));
        assert!(err("(SELECT 1)").contains("not supported"));
        assert!(err("qty + 1 qty").contains("follows it"));
        assert!(err("CAST(qty AS money)").contains("types are"));
        assert!(err("round(CAST(qty AS double), 2)").contains("numeric"));
        assert!(err("t.qty").contains("by itself"));
        assert!(err("").contains("not an SQL expression"));
    }

    #[test]
    fn both_stores_compute_alike() {
        let e = ok("ts >= '2026-01-01'");
        assert_eq!(
            e.postgres,
            "(\"ts\" >= CAST('2026-01-01T00:00:00.000Z' AS TIMESTAMPTZ))"
        );
        assert_eq!(e.sqlite, "(\"ts\" >= '2026-01-01T00:00:00.000Z')");
        assert!(
            ok("ts IN ('2026-01-01T10:00:00+01:00')")
                .sqlite
                .contains("'2026-01-01T09:00:00.000Z'")
        );
        assert!(err("ts > 'yesterday'").contains("not a timestamp"));
        assert!(err("coalesce(ts, '1970-01-01')").contains("CAST it"));
        let e = ok("amount / 2");
        assert_eq!(e.sqlite, "(CAST(\"amount\" AS REAL) / sluice_nonzero(2))");
        assert_eq!(e.postgres, "(\"amount\" / 2)");
        assert_eq!(ok("qty / 2").sqlite, "(\"qty\" / sluice_nonzero(2))");
        assert!(ok("qty % 2").sqlite.contains("sluice_nonzero"));
        assert!(err("amount % 2").contains("integers"));
        assert!(err("coalesce(qty)").contains("2 to 64"));
        assert!(err("1_000 + qty").contains("decimal"));
        assert!(err("0x1F + qty").contains("decimal"));
        assert!(err("CAST(vip AS text)").contains("CAST from boolean"));
        assert_eq!(ok("CAST(ts AS date)").ty, Some(C::Date));
        assert_eq!(
            ok("substr(order_id, qty)").postgres,
            "substr(\"order_id\", CAST(\"qty\" AS INTEGER))"
        );
        assert!(err("_sluice_attributes ->> order_id").contains("literal"));
        assert_eq!(
            ok("_sluice_attributes ->> 'region'").sqlite,
            "CAST((\"_sluice_attributes\" ->> 'region') AS TEXT)"
        );
        assert!(ok("order_id LIKE 'o%'").sqlite.ends_with("ESCAPE '\\')"));
    }

    #[test]
    fn values_fit_columns_of_their_kind() {
        assert!(fits(&ok("qty"), C::Numeric));
        assert!(fits(&ok("amount"), C::Double));
        assert!(!fits(&ok("amount"), C::Integer));
        assert!(!fits(&ok("order_id"), C::Integer));
        assert!(fits(&ok("NULL"), C::Integer));
    }
}
