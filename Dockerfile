# fencer's container image: a static fencer binary on a distroless base,
# run as a non-root user. Build from the repository root:
#   docker build -t fencer .
# The entry point is the fencer command; the default is "serve" (see
# deploy/service for its flags in a Deployment).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY token/go.mod token/go.sum ./token/
COPY proto/go.mod proto/go.sum ./proto/
COPY client/go.mod client/go.sum ./client/
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/fencer ./cmd/fencer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fencer /fencer
USER 65532:65532
EXPOSE 7890 7891
ENTRYPOINT ["/fencer"]
CMD ["serve"]
