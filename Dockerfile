# The sluice worker image: the `sluice` binary alone on a distroless base, run as a non-root
# user. Build: `docker build -t sluice .` (the chart's `image` values point at it).

# Build: the release profile, the lockfile's versions, the system SQLite (as on the machines
# the tests run on).
FROM rust:1.95-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice \
    && mkdir -p /out \
    && cp target/release/sluice /out/sluice \
    && cp "/usr/lib/$(gcc -print-multiarch)/libsqlite3.so.0" /out/

# Run: glibc, libgcc and CA certificates from distroless, SQLite's library from the build
# stage (same Debian release), user 65532 (`nonroot`). The chart mounts the only writable
# paths (/var/lib/sluice, /tmp) and the pipeline file.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/libsqlite3.so.0 /usr/lib/libsqlite3.so.0
COPY --from=build /out/sluice /usr/local/bin/sluice
USER 65532:65532
WORKDIR /var/lib/sluice
EXPOSE 9464 50051
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["--help"]
