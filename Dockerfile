# syntax=docker/dockerfile:1
# endpoints-guard: a release build in a Rust image, then only the binary on a
# distroless, non-root runtime (glibc + libgcc, no shell, no package manager).
#
#   docker build -t endpoints-guard:dev .
#
# The production image holds endpoints-guard alone. watch-chaos, the
# fault-injecting API proxy the chart runs as a sidecar for tests only
# (chaos.enabled), is an image of its own, never the one operators run:
#
#   docker build --target watch-chaos -t endpoints-guard-watch-chaos:dev .

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artifacts between builds; the
# binaries are copied out of the cached target folder.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p endpoints-guard -p watch-chaos --bins \
 && mkdir -p /out \
 && cp target/release/endpoints-guard target/release/watch-chaos /out/

# FOR TESTS ONLY: the watch-chaos sidecar's image.
FROM gcr.io/distroless/cc-debian12:nonroot AS watch-chaos
COPY --from=build /out/watch-chaos /usr/local/bin/watch-chaos
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/watch-chaos"]

# The default target: what operators run.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/endpoints-guard /usr/local/bin/endpoints-guard
# distroless "nonroot": uid/gid 65532, matching the chart's securityContext.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/endpoints-guard"]
