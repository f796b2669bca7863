# fencer's container image: a static fencer binary on a distroless base,
# run as a non-root user. Build from the repository root, stamping the
# version and commit that fencer version prints (.git is not copied in):
#   docker build -t REGISTRY/fencer:v0.1.0 \
#     --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
# scripts/release.sh prints this command for the release it cuts.
# The entry point is the fencer command; the default is "serve" (see
# deploy/service for its flags in a Deployment).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY token/go.mod token/go.sum ./token/
COPY proto/go.mod proto/go.sum ./proto/
COPY client/go.mod client/go.sum ./client/
COPY kubeadapter/go.mod kubeadapter/go.sum ./kubeadapter/
COPY internal/mutant/go.mod ./internal/mutant/
COPY internal/rendezvous/go.mod internal/rendezvous/go.sum ./internal/rendezvous/
COPY internal/freeport/go.mod internal/freeport/go.sum ./internal/freeport/
RUN go mod download
COPY . .
ARG VERSION
ARG COMMIT
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o /out/fencer ./cmd/fencer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fencer /fencer
USER 65532:65532
EXPOSE 7890 7891
ENTRYPOINT ["/fencer"]
CMD ["serve"]
